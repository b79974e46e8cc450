#!/usr/bin/env python3
"""Static checks for deploy/: YAML parses, k8s objects are well-formed, compose has its
services, probes hit the right paths, and condenser itself accepts the configs.

Usage: python3 deploy/check.py [path/to/condenser]   (needs PyYAML; Python 3.11+ for tomllib)
"""
import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent

# Configs are validated by condenser itself (`check-config`), the one authority on its keys:
# an unknown key would stop a pod. Pass the binary as the first argument.
CONDENSER = Path(sys.argv[1] if len(sys.argv) > 1 else DEPLOY.parent / "target/debug/condenser")


class File:
    """Checks recorded against one file; report() prints its single line."""

    def __init__(self, path):
        self.path = path
        self.passed = 0
        self.failures = []

    def check(self, ok, message):
        if ok:
            self.passed += 1
        else:
            self.failures.append(message)
        return ok

    def report(self):
        name = self.path.relative_to(DEPLOY.parent)
        total = self.passed + len(self.failures)
        if self.failures:
            print(f"FAIL {name}: {self.passed}/{total} - " + "; ".join(self.failures))
        else:
            print(f"ok   {name}: {total}/{total}")


def check_config_text(f, text, where):
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        f.check(False, f"{where} is not valid TOML: " + " ".join(str(e).split()))
        return None
    f.check(True, "")
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as tmp:
        tmp.write(text)
        tmp.flush()
        result = subprocess.run([str(CONDENSER), "check-config", tmp.name], capture_output=True, text=True)
    f.check(result.returncode == 0, f"{where} rejected by condenser check-config: {result.stderr.strip()}")
    return cfg


def dig(obj, *keys):
    for key in keys:
        if isinstance(obj, dict):
            obj = obj.get(key)
        elif isinstance(obj, list) and isinstance(key, int) and key < len(obj):
            obj = obj[key]
        else:
            return None
    return obj


def check_compose(f, doc):
    services = (doc or {}).get("services") or {}
    missing = {"redis", "condenser-a", "condenser-b", "lb"} - set(services)
    f.check(not missing, f"missing services: {', '.join(sorted(missing))}")
    # Bind-mounted files must exist, relative to the compose file.
    absent = []
    for svc in services.values():
        for vol in (svc or {}).get("volumes") or []:
            src = vol.split(":")[0] if isinstance(vol, str) else ""
            if src.startswith(".") and not (f.path.parent / src).exists():
                absent.append(src)
    f.check(not absent, f"mounted files missing: {', '.join(absent)}")


def check_deployment(f, doc):
    container = dig(doc, "spec", "template", "spec", "containers", 0) or {}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        got = dig(container, probe, "httpGet", "path")
        f.check(got == path, f"{probe} path is {got!r}, want {path}")


def check_dashboard_copy(f, text):
    """The Kubernetes ConfigMap carries the dashboard of deploy/grafana, not a stale copy."""
    try:
        copy = json.loads(text)
    except json.JSONDecodeError as e:
        f.check(False, f"dashboard ConfigMap is not JSON: {e}")
        return
    source = json.loads((DEPLOY / "grafana" / "condenser.json").read_text())
    f.check(copy == source, "dashboard ConfigMap differs from grafana/condenser.json")


def main():
    files = []
    k8s_docs = []  # (File, doc) for cross-file checks
    for path in sorted(list(DEPLOY.rglob("*.yaml")) + list(DEPLOY.rglob("*.yml"))):
        f = File(path)
        files.append(f)
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except yaml.YAMLError as e:
            f.check(False, "YAML error: " + " ".join(str(e).split()))
            continue
        f.check(bool(docs), "no YAML documents")
        if path.name == "docker-compose.yml":
            check_compose(f, docs[0])
            continue
        if "k8s" not in path.relative_to(DEPLOY).parts:
            continue
        if path.name == "kustomization.yaml":
            resources = docs[0].get("resources") or []
            absent = [r for r in resources if not (path.parent / r).exists()]
            f.check(bool(resources) and not absent, f"resources missing: {absent or 'none listed'}")
            continue
        for doc in docs:
            name = dig(doc, "metadata", "name")
            f.check(bool(doc.get("apiVersion") and doc.get("kind") and name),
                    f"document lacks apiVersion/kind/metadata.name: {doc.get('kind')}/{name}")
            k8s_docs.append((f, doc))
            if doc.get("kind") == "Deployment":
                check_deployment(f, doc)
            elif doc.get("kind") == "ConfigMap" and "condenser.json" in (doc.get("data") or {}):
                check_dashboard_copy(f, doc["data"]["condenser.json"])
            elif doc.get("kind") == "ConfigMap":
                text = dig(doc, "data", "config.toml")
                if f.check(isinstance(text, str), f"ConfigMap {name} has no config.toml key"):
                    check_config_text(f, text, f"ConfigMap {name} config.toml")

    # Cross-file: every Service selects some pod template and targets a port it declares.
    pods = [dig(d, "spec", "template") for _, d in k8s_docs if d.get("kind") in ("Deployment", "StatefulSet")]
    for f, doc in k8s_docs:
        if doc.get("kind") != "Service":
            continue
        selector = dig(doc, "spec", "selector") or {}
        targets = [p for p in pods
                   if selector and selector.items() <= (dig(p, "metadata", "labels") or {}).items()]
        port_names = {pt.get("name") for p in targets for c in dig(p, "spec", "containers") or []
                      for pt in c.get("ports") or []}
        bad = [str(p.get("targetPort")) for p in dig(doc, "spec", "ports") or []
               if isinstance(p.get("targetPort"), str) and p["targetPort"] not in port_names]
        f.check(bool(targets) and not bad,
                f"Service {dig(doc, 'metadata', 'name')} selects no pods or unknown targetPort {bad}")

    for toml_path in sorted(DEPLOY.glob("*.toml")):
        f = File(toml_path)
        files.append(f)
        check_config_text(f, toml_path.read_text(), toml_path.name)

    for f in files:
        f.report()
    passed = sum(f.passed for f in files)
    failed = sum(len(f.failures) for f in files)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
