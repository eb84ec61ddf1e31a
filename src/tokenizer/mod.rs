//! Tokenizers (Hugging Face `tokenizers` under a `Tokenizer` trait), chat templates and
//! streaming detokenization.
