//! The tokenizer encodings condenser counts with, by their tiktoken names.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    Cl100k,
    O200k,
    O200kHarmony,
}

impl Encoding {
    pub fn from_name(name: &str) -> Option<Encoding> {
        match name {
            "cl100k_base" => Some(Encoding::Cl100k),
            "o200k_base" => Some(Encoding::O200k),
            "o200k_harmony" => Some(Encoding::O200kHarmony),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Encoding::Cl100k => "cl100k_base",
            Encoding::O200k => "o200k_base",
            Encoding::O200kHarmony => "o200k_harmony",
        }
    }
}
