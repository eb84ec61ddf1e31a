//! llama.cpp's GBNF grammars, rewritten in llguidance's Lark syntax.
//!
//! GBNF: rules `name ::= body`, the start rule is `root`; bodies are alternatives (`|`) of
//! sequences of string literals (`"..."`), character classes (`[a-z]`, `[^"\\]`), the any
//! character `.`, rule names and parenthesised groups, each optionally repeated with `*`, `+`,
//! `?`, `{m}`, `{m,}` or `{m,n}`; `#` starts a comment. Escapes: `\n \r \t \\ \" \[ \] \-`,
//! `\xHH`, `\uHHHH`, `\UHHHHHHHH`.
//!
//! The rewrite keeps the structure: each rule becomes a Lark rule (names lowercased, since
//! capitalised Lark names are terminals), literals become JSON-quoted Lark strings, classes and
//! `.` become regex terminals, repetitions keep their bounds (llguidance accepts `x{m,n}`), and
//! `start: root` is added. Errors say what is wrong and where (line and column).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// The Lark text of a GBNF grammar, or what is wrong with it.
pub fn to_lark(gbnf: &str) -> Result<String, String> {
    let rules = Parser { text: gbnf, pos: 0 }.grammar()?;
    if !rules.iter().any(|(name, _)| name == "root") {
        return Err("the GBNF grammar has no `root` rule (the start rule)".into());
    }
    let names = lark_names(rules.iter().map(|(n, _)| n.as_str()));
    let mut out = String::from("start: ");
    out.push_str(&names["root"]);
    out.push('\n');
    for (name, body) in &rules {
        let _ = write!(out, "{}: ", names[name.as_str()]);
        body.write(&names, &mut out)?;
        out.push('\n');
    }
    Ok(out)
}

/// Lark names for GBNF rule names: lowercase (a capitalised Lark name is a terminal), distinct,
/// never `start`.
fn lark_names<'a>(gbnf: impl Iterator<Item = &'a str>) -> HashMap<String, String> {
    let mut taken: BTreeMap<String, ()> = BTreeMap::from([("start".to_string(), ())]);
    let mut out = HashMap::new();
    for name in gbnf {
        if out.contains_key(name) {
            continue;
        }
        let mut base = name.to_ascii_lowercase();
        if !base.starts_with(|c: char| c.is_ascii_lowercase()) {
            base.insert_str(0, "r_");
        }
        let mut candidate = base.clone();
        let mut n = 2;
        while taken.contains_key(&candidate) {
            candidate = format!("{base}_{n}");
            n += 1;
        }
        taken.insert(candidate.clone(), ());
        out.insert(name.to_string(), candidate);
    }
    out
}

#[derive(Debug)]
enum Node {
    Literal(String),
    /// A character class: negated, and (first, last) ranges.
    Class(bool, Vec<(char, char)>),
    Any,
    Rule(String, usize),
    Alternatives(Vec<Vec<Node>>),
    Repeat(Box<Node>, u32, Option<u32>),
}

impl Node {
    fn write(&self, names: &HashMap<String, String>, out: &mut String) -> Result<(), String> {
        match self {
            Node::Literal(s) => out.push_str(&serde_json::to_string(s).unwrap_or_default()),
            Node::Class(negated, ranges) => {
                out.push_str(if *negated { "/[^" } else { "/[" });
                for &(a, b) in ranges {
                    let _ = write!(out, "\\x{{{:x}}}", a as u32);
                    if b != a {
                        let _ = write!(out, "-\\x{{{:x}}}", b as u32);
                    }
                }
                out.push_str("]/");
            }
            Node::Any => out.push_str("/(?s:.)/"),
            Node::Rule(name, at) => match names.get(name) {
                Some(n) => out.push_str(n),
                None => return Err(format!("rule `{name}` is used (at byte {at}) but never defined")),
            },
            Node::Alternatives(alts) => {
                out.push('(');
                for (i, seq) in alts.iter().enumerate() {
                    if i > 0 {
                        out.push_str(" | ");
                    }
                    write_sequence(seq, names, out)?;
                }
                out.push(')');
            }
            Node::Repeat(node, min, max) => {
                node.write(names, out)?;
                match (min, max) {
                    (0, None) => out.push('*'),
                    (1, None) => out.push('+'),
                    (0, Some(1)) => out.push('?'),
                    (m, None) => {
                        let _ = write!(out, "{{{m},}}");
                    }
                    (m, Some(n)) => {
                        let _ = write!(out, "{{{m},{n}}}");
                    }
                }
            }
        }
        Ok(())
    }
}

fn write_sequence(seq: &[Node], names: &HashMap<String, String>, out: &mut String) -> Result<(), String> {
    if seq.is_empty() {
        out.push_str("\"\"");
    }
    for (i, node) in seq.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        node.write(names, out)?;
    }
    Ok(())
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        &self.text[self.pos..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    /// "line L, column C" of the current position.
    fn here(&self) -> String {
        let before = &self.text[..self.pos];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        format!("line {line}, column {column}")
    }

    fn fail<T>(&self, what: impl std::fmt::Display) -> Result<T, String> {
        Err(format!("{what} at {}", self.here()))
    }

    /// Skip whitespace (newlines too) and `#` comments.
    fn skip_space(&mut self) {
        loop {
            match self.peek() {
                Some(c) if c.is_whitespace() => {
                    self.bump();
                }
                Some('#') => {
                    while let Some(c) = self.bump() {
                        if c == '\n' {
                            break;
                        }
                    }
                }
                _ => return,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let len = self
            .rest()
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(self.rest().len());
        if len == 0 {
            return None;
        }
        let name = self.rest()[..len].to_string();
        self.pos += len;
        Some(name)
    }

    /// Whether a rule definition (`name ::=`) starts here.
    fn at_definition(&self) -> bool {
        let mut p = Parser { text: self.text, pos: self.pos };
        if p.name().is_none() {
            return false;
        }
        p.skip_space();
        p.rest().starts_with("::=")
    }

    fn grammar(mut self) -> Result<Vec<(String, Node)>, String> {
        let mut rules: Vec<(String, Node)> = Vec::new();
        self.skip_space();
        while self.peek().is_some() {
            let Some(name) = self.name() else { return self.fail("expected a rule name") };
            self.skip_space();
            if !self.rest().starts_with("::=") {
                return self.fail(format!("expected `::=` after the rule name `{name}`"));
            }
            self.pos += 3;
            let body = self.alternatives(false)?;
            if rules.iter().any(|(n, _)| *n == name) {
                return Err(format!("the rule `{name}` is defined twice"));
            }
            rules.push((name, body));
            self.skip_space();
        }
        if rules.is_empty() {
            return Err("the GBNF grammar is empty".into());
        }
        Ok(rules)
    }

    /// Alternatives up to the end of the rule (the next definition or the end of the text), or
    /// up to `)` when `nested`.
    fn alternatives(&mut self, nested: bool) -> Result<Node, String> {
        let mut alts = vec![Vec::new()];
        loop {
            self.skip_space();
            match self.peek() {
                None => break,
                Some(')') if nested => break,
                Some(')') => return self.fail("unbalanced `)`"),
                Some('|') => {
                    self.bump();
                    alts.push(Vec::new());
                }
                Some(_) if !nested && self.at_definition() => break,
                Some(_) => {
                    let item = self.item()?;
                    if let Some(seq) = alts.last_mut() {
                        seq.push(item);
                    }
                }
            }
        }
        Ok(Node::Alternatives(alts))
    }

    fn item(&mut self) -> Result<Node, String> {
        let start = self.pos;
        let node = match self.peek() {
            Some('"') => {
                self.bump();
                let mut s = String::new();
                loop {
                    match self.peek() {
                        None => return self.fail("unterminated string literal"),
                        Some('"') => {
                            self.bump();
                            break;
                        }
                        Some(_) => s.push(self.char()?),
                    }
                }
                Node::Literal(s)
            }
            Some('[') => {
                self.bump();
                let negated = self.rest().starts_with('^');
                if negated {
                    self.bump();
                }
                let mut ranges = Vec::new();
                loop {
                    match self.peek() {
                        None => return self.fail("unterminated character class"),
                        Some(']') => {
                            self.bump();
                            break;
                        }
                        Some(_) => {
                            let first = self.char()?;
                            let last = if self.rest().starts_with('-') && !self.rest().starts_with("-]") {
                                self.bump();
                                self.char()?
                            } else {
                                first
                            };
                            if last < first {
                                return self.fail(format!("the range {first:?}-{last:?} is backwards"));
                            }
                            ranges.push((first, last));
                        }
                    }
                }
                if ranges.is_empty() {
                    return self.fail("empty character class");
                }
                Node::Class(negated, ranges)
            }
            Some('.') => {
                self.bump();
                Node::Any
            }
            Some('(') => {
                self.bump();
                let inner = self.alternatives(true)?;
                if self.bump() != Some(')') {
                    return self.fail("unclosed `(`");
                }
                inner
            }
            Some(c) if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let name = self.name().unwrap_or_default();
                Node::Rule(name, start)
            }
            Some(c) => return self.fail(format!("unexpected {c:?}")),
            None => return self.fail("unexpected end of the grammar"),
        };
        self.repetition(node)
    }

    fn repetition(&mut self, node: Node) -> Result<Node, String> {
        let (min, max) = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                let close = match self.rest().find('}') {
                    Some(i) => i,
                    None => return self.fail("unclosed `{`"),
                };
                let inside = self.rest()[1..close].to_string();
                let number = |s: &str| s.trim().parse::<u32>().map_err(|_| format!("bad repetition bound {s:?}"));
                let bounds = match inside.split_once(',') {
                    None => number(&inside).map(|n| (n, Some(n))),
                    Some((m, n)) if n.trim().is_empty() => number(m).map(|m| (m, None)),
                    Some((m, n)) => number(m).and_then(|m| number(n).map(|n| (m, Some(n)))),
                };
                let (min, max) = match bounds {
                    Ok(b) => b,
                    Err(e) => return self.fail(e),
                };
                if max.is_some_and(|max| max < min) {
                    return self.fail(format!("the repetition {{{inside}}} has its maximum below its minimum"));
                }
                self.pos += close;
                (min, max)
            }
            _ => return Ok(node),
        };
        self.bump();
        Ok(Node::Repeat(Box::new(node), min, max))
    }

    /// One character of a literal or class, escapes resolved.
    fn char(&mut self) -> Result<char, String> {
        let Some(c) = self.bump() else { return self.fail("unexpected end of the grammar") };
        if c != '\\' {
            return Ok(c);
        }
        let Some(e) = self.bump() else { return self.fail("unfinished escape") };
        let hex = |p: &mut Self, digits: usize| -> Result<char, String> {
            let code = p.rest().get(..digits).and_then(|h| u32::from_str_radix(h, 16).ok());
            match code.and_then(char::from_u32) {
                Some(c) => {
                    p.pos += digits;
                    Ok(c)
                }
                None => p.fail(format!("bad \\{e} escape (needs {digits} hex digits of a character)")),
            }
        };
        match e {
            'n' => Ok('\n'),
            'r' => Ok('\r'),
            't' => Ok('\t'),
            '\\' | '"' | '[' | ']' | '-' | '^' | '/' => Ok(e),
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            other => self.fail(format!("unknown escape \\{other}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_literals_classes_and_repetitions() {
        let lark = to_lark(
            "# a comment\nroot ::= greeting (\" \" Name)? [!.]{1,3}\ngreeting ::= \"hi\" | \"hello\\n\"\nName ::= [A-Z] [a-z]* .",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: root\nroot: (greeting (\" \" name)? /[\\x{21}\\x{2e}]/{1,3})\ngreeting: (\"hi\" | \"hello\\n\")\n\
             name: (/[\\x{41}-\\x{5a}]/ /[\\x{61}-\\x{7a}]/* /(?s:.)/)\n"
        );
    }

    #[test]
    fn definitions_may_span_lines_and_names_stay_distinct() {
        let lark = to_lark("root ::=\n  a\n  | b\na ::= \"x\"{2}\nA ::= \"y\"{2,}\nb ::= A").unwrap();
        assert!(lark.contains("root: (a | b)"), "{lark}");
        assert!(lark.contains("a: (\"x\"{2,2})"), "{lark}");
        assert!(lark.contains("a_2: (\"y\"{2,})"), "{lark}");
        assert!(lark.contains("b: (a_2)"), "{lark}");
    }

    #[test]
    fn errors_say_what_and_where() {
        let err = |g: &str| to_lark(g).unwrap_err();
        assert!(err("").contains("empty"));
        assert!(err("expr ::= \"a\"").contains("no `root`"));
        assert!(err("root ::= thing").contains("`thing` is used"));
        assert!(err("root ::= \"abc").contains("unterminated string"));
        assert!(err("root ::= [abc").contains("unterminated character class"));
        assert!(err("root ::= (\"a\"").contains("unclosed `(`"));
        assert!(err("root ::= \"a\")").contains("unbalanced"));
        assert!(err("root \"a\"").contains("expected `::=`"));
        assert!(err("root ::= \"\\q\"").contains("unknown escape"));
        assert!(err("root ::= [z-a]").contains("backwards"));
        assert!(err("root ::= \"a\"{3,1}").contains("maximum below"));
        assert!(err("root ::= \"a\"\nroot ::= \"b\"").contains("defined twice"));
        assert!(err("root ::= \"a\"\n  ::= x").contains("line 2, column 3"), "{}", err("root ::= \"a\"\n  ::= x"));
    }
}
