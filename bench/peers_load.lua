-- wrk's requests for bench/peers.sh: a small chat completion, every body distinct (a run id
-- and a counter in the user's message), so that no proxy can answer one from a cache of its
-- own. From the environment: BENCH_PATH, BENCH_MODEL, BENCH_STREAM=1 for streamed answers,
-- BENCH_RUN (a run id), BENCH_HEADERS ("name: value|name: value", added to each request).
local path = os.getenv("BENCH_PATH") or "/v1/chat/completions"
local model = os.getenv("BENCH_MODEL") or "gpt-4o"
local stream = os.getenv("BENCH_STREAM") == "1" and '"stream":true,' or ''
local run = os.getenv("BENCH_RUN") or "0"
local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. (os.getenv("BENCH_KEY") or "sk-bench")}
for pair in string.gmatch(os.getenv("BENCH_HEADERS") or "", "[^|]+") do
  local name, value = string.match(pair, "^%s*([^:]+):%s*(.*)$")
  if name then headers[name] = value end
end
local head = '{"model":"' .. model .. '",' .. stream ..
  '"max_tokens":64,"messages":[{"role":"system","content":"You are terse."},' ..
  '{"role":"user","content":"Run ' .. run .. ', question '
local tail = ': is the deployment healthy? Answer in one line."}]}'
local n = 0
request = function()
  n = n + 1
  return wrk.format("POST", path, headers, head .. n .. tail)
end
