//! Reasoning models: a thinking model's reasoning separated from its answer, as vLLM's
//! reasoning parsers do (`reasoning_content` beside `content`, streamed as
//! `delta.reasoning_content`).
//!
//! [`FAMILIES`] is the table of the families weft knows, by vLLM's parser names, with their
//! markers. Both write `<think>` … `</think>`; they are told apart only to be named as vLLM
//! names them (`--reasoning-parser qwen3` or `deepseek_r1`; QwQ uses `deepseek_r1`, as in
//! vLLM). A parser is chosen from the model ([`ReasoningParser::detect`]: its chat template
//! mentions the start marker and its vocabulary has both markers as single tokens) or named
//! (`ReasoningParser::resolve`, `weft serve --reasoning-parser NAME|none`).
//!
//! The rule, the same for every family and for streamed and whole answers (vLLM's Qwen3 and
//! DeepSeek-R1 parsers, with the prompt consulted as vLLM's `prompt_is_reasoning_end` does):
//! - a prompt whose text ends with the end marker (Qwen3's template with `enable_thinking:
//!   false` appends `<think>\n\n</think>\n\n`) has closed the reasoning: the whole output is
//!   the answer, and nothing in it is parsed;
//! - otherwise the output opens inside the reasoning (Qwen3's and DeepSeek-R1's templates may
//!   already put `<think>` into the prompt, and DeepSeek-R1 may start without it): a start
//!   marker at its beginning (after any whitespace) is dropped, everything up to the first end
//!   marker is `reasoning_content`, the marker is dropped and the rest is `content`. An output
//!   that never writes the end marker (cut off by `max_tokens`) is reasoning only.
//!
//! A streamed answer goes through [`ReasoningSplitter`], which holds back text that could be
//! the beginning of a marker until the next text decides, so a partial marker never reaches
//! `content` or `reasoning_content`; its pieces concatenate to what [`split`] gives the whole
//! text. Structured output and tool calls apply to the answer: the engine starts a request's
//! constraint after the end marker's token (`GenerationParams::constraint_after`), and tool
//! calls are read out of `content` only.

use crate::engine::render_chat;
use crate::engine::request::Prompt;
use crate::error::WeftError;
use crate::openai::OpenAiRequest;
use crate::openai::error::{ApiResult, OpenAiError};
use crate::tokenizer::Tokenizer;

/// A family of thinking models: vLLM's parser name and the markers around the reasoning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasoningFamily {
    /// vLLM's `--reasoning-parser` name.
    pub name: &'static str,
    /// Opens the reasoning (the template may write it into the prompt instead).
    pub start: &'static str,
    /// Closes the reasoning; the answer follows.
    pub end: &'static str,
    /// Text of the chat template that marks this family (checked in table order; the last
    /// row has none and takes any template that mentions its start marker).
    pub template_mark: Option<&'static str>,
}

/// The families weft separates reasoning for.
pub const FAMILIES: &[ReasoningFamily] = &[
    // DeepSeek-R1 and its distills: the template's turns are `<｜Assistant｜>`; R1 may open
    // its output inside the reasoning without `<think>`. QwQ is parsed as this family in vLLM.
    ReasoningFamily { name: "deepseek_r1", start: "<think>", end: "</think>", template_mark: Some("｜Assistant｜") },
    // Qwen3 (hybrid: `enable_thinking`; and the Thinking-2507 models, whose template writes
    // `<think>\n` into the prompt).
    ReasoningFamily { name: "qwen3", start: "<think>", end: "</think>", template_mark: None },
];

/// The family vLLM calls `name`.
pub fn family(name: &str) -> Option<&'static ReasoningFamily> {
    FAMILIES.iter().find(|f| f.name == name)
}

/// The names `--reasoning-parser` takes: the families, then `none`.
pub fn parser_names() -> String {
    let mut names: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
    names.push("none");
    names.join(", ")
}

/// A family resolved against one model's vocabulary: what the server and the browser build
/// separate reasoning with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasoningParser {
    pub family: &'static ReasoningFamily,
    /// The end marker's token id (the engine's `constraint_after`).
    pub end_id: u32,
}

/// The single token `text` is in this vocabulary, if it is one, decoded as itself (so it
/// reaches the text the parser reads).
fn single_token(tok: &dyn Tokenizer, text: &str) -> Option<u32> {
    match tok.encode(text, false).ok()?.as_slice() {
        [id] if tok.decode(&[*id], true).ok()?.as_str() == text => Some(*id),
        _ => None,
    }
}

impl ReasoningParser {
    /// `family` for this model: both markers must be single tokens of its vocabulary that
    /// decode to themselves.
    pub fn for_model(family: &'static ReasoningFamily, tok: &dyn Tokenizer) -> Result<Self, String> {
        let missing = |m: &str| {
            format!(
                "the reasoning parser {} needs {m} to be one token of the model's vocabulary, and it is not; this \
                 model does not think in that format: choose another parser or none",
                family.name
            )
        };
        single_token(tok, family.start).ok_or_else(|| missing(family.start))?;
        let end_id = single_token(tok, family.end).ok_or_else(|| missing(family.end))?;
        Ok(ReasoningParser { family, end_id })
    }

    /// The parser this model's chat template and vocabulary call for: the template mentions a
    /// family's start marker and the vocabulary has both its markers; `None` for a model that
    /// does not think (or has no chat template).
    pub fn detect(tok: &dyn Tokenizer) -> Option<Self> {
        let source = tok.chat_template()?.source();
        FAMILIES
            .iter()
            .filter(|f| source.contains(f.start))
            .find(|f| f.template_mark.is_none_or(|m| source.contains(m)))
            .and_then(|f| Self::for_model(f, tok).ok())
    }

    /// `weft serve --reasoning-parser`: `None` (the flag not given) detects, `"none"` turns
    /// separation off, a family name forces that family (an error when the name is unknown
    /// or the model's vocabulary lacks its markers).
    pub fn resolve(choice: Option<&str>, tok: &dyn Tokenizer) -> Result<Option<Self>, String> {
        match choice {
            None => Ok(Self::detect(tok)),
            Some("none") => Ok(None),
            Some(name) => {
                let f = family(name).ok_or_else(|| unknown_parser(name))?;
                Self::for_model(f, tok).map(Some)
            }
        }
    }

    /// Whether an output that continues `prompt` opens inside the reasoning: unless the prompt
    /// (trailing whitespace aside) ends with the end marker, it does.
    pub fn opens_reasoning(&self, prompt: &str) -> bool {
        !prompt.trim_end().ends_with(self.family.end)
    }
}

/// How one request's output is separated: its family, and whether the output opens inside the
/// reasoning (otherwise the prompt closed it, and the output is all answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reasoning {
    pub family: &'static ReasoningFamily,
    pub open: bool,
}

impl OpenAiRequest {
    /// Separate this chat request's reasoning with `parser` (the server's or the page's; none:
    /// no separation). The prompt is rendered to read whether it closed the reasoning (the
    /// engine renders it again when the request is submitted); where it did not and the
    /// request has a constraint (structured output, a required tool call), the constraint
    /// starts after the end marker's token. Text completions are left alone.
    pub fn apply_reasoning(&mut self, tok: &dyn Tokenizer, parser: Option<&ReasoningParser>) -> ApiResult<()> {
        let (Some(parser), Prompt::Chat(messages)) = (parser, &self.request.prompt) else { return Ok(()) };
        let prompt = render_chat(tok, messages, &self.request.tools, &self.request.chat_template_kwargs, true)
            .map_err(|e| match e {
                WeftError::InvalidRequest { .. } => OpenAiError::from_engine(e),
                e => OpenAiError::invalid("messages", format!("invalid messages: {e}")),
            })?;
        let open = parser.opens_reasoning(&prompt);
        self.reasoning = Some(Reasoning { family: parser.family, open });
        if open {
            self.request.params.constraint_after = Some(parser.end_id);
        }
        Ok(())
    }
}

/// The error for a `--reasoning-parser` name weft does not know.
pub fn unknown_parser(name: &str) -> String {
    format!("unknown reasoning parser {name:?}; weft knows {}", parser_names())
}

/// A piece of an answer: reasoning or content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Content(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Reasoning, before anything but whitespace: a start marker here is dropped.
    Opening,
    Reasoning,
    Answer,
}

/// Splits a streamed output into reasoning and content pieces (module docs: the rule). Text
/// that may be the beginning of a marker is held back until the next push, or [`finish`].
///
/// [`finish`]: ReasoningSplitter::finish
#[derive(Clone, Debug)]
pub struct ReasoningSplitter {
    family: &'static ReasoningFamily,
    phase: Phase,
    /// Text received and not yet given out.
    held: String,
}

impl ReasoningSplitter {
    /// A splitter for an output that opens inside the reasoning (`reasoning_open`) or is all
    /// answer.
    pub fn new(family: &'static ReasoningFamily, reasoning_open: bool) -> Self {
        let phase = if reasoning_open { Phase::Opening } else { Phase::Answer };
        ReasoningSplitter { family, phase, held: String::new() }
    }

    /// The pieces `text` completes (none while it may still be part of a marker).
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        if self.phase == Phase::Answer {
            if !text.is_empty() {
                out.push(Piece::Content(text.to_string()));
            }
            return out;
        }
        self.held.push_str(text);
        if self.phase == Phase::Opening {
            let rest = self.held.trim_start();
            if rest.is_empty() || (rest.len() < self.family.start.len() && self.family.start.starts_with(rest)) {
                return out;
            }
            self.held = match rest.strip_prefix(self.family.start) {
                Some(after) => after.to_string(),
                None => std::mem::take(&mut self.held),
            };
            self.phase = Phase::Reasoning;
        }
        let end = self.family.end;
        if let Some(i) = self.held.find(end) {
            let content = self.held.split_off(i + end.len());
            self.held.truncate(i);
            if !self.held.is_empty() {
                out.push(Piece::Reasoning(std::mem::take(&mut self.held)));
            }
            self.phase = Phase::Answer;
            self.held.clear();
            if !content.is_empty() {
                out.push(Piece::Content(content));
            }
            return out;
        }
        // Keep back the longest tail that is the beginning of the end marker.
        let keep = (1..end.len().min(self.held.len() + 1))
            .rev()
            .find(|&n| self.held.is_char_boundary(self.held.len() - n) && self.held.ends_with(&end[..n]))
            .unwrap_or(0);
        let tail = self.held.split_off(self.held.len() - keep);
        if !self.held.is_empty() {
            out.push(Piece::Reasoning(std::mem::replace(&mut self.held, tail)));
        } else {
            self.held = tail;
        }
        out
    }

    /// The end of the output: what is still held back is reasoning (a marker never finished).
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        match self.phase {
            Phase::Answer => Vec::new(),
            _ if held.is_empty() => Vec::new(),
            _ => vec![Piece::Reasoning(held)],
        }
    }
}

/// A whole output's reasoning and content (`None` where there is none): what the streamed
/// pieces concatenate to.
pub fn split(family: &'static ReasoningFamily, reasoning_open: bool, text: &str) -> (Option<String>, Option<String>) {
    let mut s = ReasoningSplitter::new(family, reasoning_open);
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    let (mut reasoning, mut content) = (None::<String>, None::<String>);
    for p in pieces {
        match p {
            Piece::Reasoning(t) => reasoning.get_or_insert_default().push_str(&t),
            Piece::Content(t) => content.get_or_insert_default().push_str(&t),
        }
    }
    (reasoning, content)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen3() -> &'static ReasoningFamily {
        family("qwen3").unwrap()
    }

    /// Every way of cutting `text` into up to three chunks (at char boundaries) gives the
    /// pieces of the whole, and no piece holds part of a marker.
    fn all_chunkings(family: &'static ReasoningFamily, open: bool, text: &str) -> (Option<String>, Option<String>) {
        let whole = split(family, open, text);
        let cuts: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        for &a in &cuts {
            for &b in cuts.iter().filter(|&&b| b >= a) {
                let mut s = ReasoningSplitter::new(family, open);
                let mut pieces = Vec::new();
                for chunk in [&text[..a], &text[a..b], &text[b..]] {
                    pieces.extend(s.push(chunk));
                }
                pieces.extend(s.finish());
                let (mut r, mut c) = (None::<String>, None::<String>);
                for p in &pieces {
                    match p {
                        Piece::Reasoning(t) => r.get_or_insert_default().push_str(t),
                        Piece::Content(t) => c.get_or_insert_default().push_str(t),
                    }
                    let t = match p {
                        Piece::Reasoning(t) | Piece::Content(t) => t,
                    };
                    assert!(!t.is_empty(), "an empty piece for {text:?} cut at {a}, {b}");
                }
                assert_eq!((r, c), whole, "{text:?} cut at {a}, {b}: {pieces:?}");
            }
        }
        whole
    }

    fn some(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    #[test]
    fn qwen3_thinking_output() {
        let f = qwen3();
        // Qwen3 with thinking on writes <think> itself.
        assert_eq!(
            all_chunkings(f, true, "<think>\nLet me add.\n</think>\n\n4"),
            (some("\nLet me add.\n"), some("\n\n4"))
        );
        // Its Thinking-2507 template put <think> into the prompt: only </think> comes.
        assert_eq!(all_chunkings(f, true, "a<b</think>x</think>"), (some("a<b"), some("x</think>")));
        // Whitespace before the start marker goes with it.
        assert_eq!(all_chunkings(f, true, "\n<think>r</think>"), (some("r"), None));
        // Cut off while thinking: all reasoning, a partial marker included.
        assert_eq!(all_chunkings(f, true, "<think>still going</thi"), (some("still going</thi"), None));
        assert_eq!(all_chunkings(f, true, "<thi"), (some("<thi"), None));
        assert_eq!(all_chunkings(f, true, ""), (None, None));
        assert_eq!(all_chunkings(f, true, "</think>"), (None, None));
        // A start marker later in the reasoning is reasoning text.
        assert_eq!(all_chunkings(f, true, "x<think>y</think>z"), (some("x<think>y"), some("z")));
        // Multi-byte characters around the markers.
        assert_eq!(all_chunkings(f, true, "<think>é</think>ü"), (some("é"), some("ü")));
        assert_eq!(all_chunkings(f, true, "é<</think><"), (some("é<"), some("<")));
    }

    #[test]
    fn closed_reasoning_is_all_answer() {
        for f in FAMILIES {
            assert_eq!(all_chunkings(f, false, "<think>a</think>b"), (None, some("<think>a</think>b")));
        }
    }

    #[test]
    fn deepseek_r1_opens_without_a_tag() {
        let f = family("deepseek_r1").unwrap();
        assert_eq!(all_chunkings(f, true, "hmm.</think>\n\nThe answer"), (some("hmm."), some("\n\nThe answer")));
        assert_eq!(all_chunkings(f, true, "<think>hmm.</think>A"), (some("hmm."), some("A")));
        assert_eq!(all_chunkings(f, true, "no end"), (some("no end"), None));
    }

    #[test]
    fn streamed_pieces_never_hold_part_of_a_marker() {
        let f = qwen3();
        let mut s = ReasoningSplitter::new(f, true);
        assert_eq!(s.push("<"), vec![]);
        assert_eq!(s.push("think>\nstep"), vec![Piece::Reasoning("\nstep".into())]);
        assert_eq!(s.push(" two</"), vec![Piece::Reasoning(" two".into())]);
        assert_eq!(s.push("thi"), vec![]);
        assert_eq!(s.push("nk>"), vec![]);
        assert_eq!(s.push("\n\nok"), vec![Piece::Content("\n\nok".into())]);
        assert_eq!(s.push("</think>"), vec![Piece::Content("</think>".into())]);
        assert_eq!(s.finish(), vec![]);
        // A held prefix that turns out not to be a marker is given out with what follows.
        let mut s = ReasoningSplitter::new(f, true);
        assert_eq!(s.push("a</th"), vec![Piece::Reasoning("a".into())]);
        assert_eq!(s.push("e end"), vec![Piece::Reasoning("</the end".into())]);
    }

    #[test]
    fn opens_reasoning_reads_the_prompt_tail() {
        let p = ReasoningParser { family: qwen3(), end_id: 0 };
        assert!(p.opens_reasoning("<|im_start|>assistant\n"));
        assert!(p.opens_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!p.opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        // An earlier turn's reasoning does not close this one's.
        assert!(p.opens_reasoning("<think>a</think>b<|im_end|>\n<|im_start|>assistant\n"));
    }

    #[test]
    fn names() {
        assert_eq!(parser_names(), "deepseek_r1, qwen3, none");
        assert!(unknown_parser("granite").contains("deepseek_r1, qwen3, none"));
        assert!(family("qwq").is_none());
    }
}
