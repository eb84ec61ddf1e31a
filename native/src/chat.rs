//! `weft chat`: an interactive conversation in the terminal. Each line read from stdin is a user
//! message; the reply streams to stdout and joins the history, so the model sees the whole
//! conversation every turn. `/reset` forgets the history (keeping the system message), `/exit`
//! or the end of stdin quits. Speeds of each reply go to stderr.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use weft::EngineBuilder;
use weft::engine::request::{GenerationParams, InferenceRequest, Prompt};
use weft::sampling::SamplingParams;
use weft::tokenizer::ChatMessage;
use weft::{Result, WeftError};

pub struct Options {
    pub model: Option<PathBuf>,
    pub system: Option<String>,
    pub max_tokens: usize,
    pub kv: crate::generate::KvOptions,
    pub sampling: SamplingParams,
}

pub fn run(opts: Options) -> Result<()> {
    opts.sampling.validate()?;
    let path = crate::generate::model_path(opts.model)?;
    let builder = opts
        .kv
        .apply(EngineBuilder::from_model(&path)?)
        .on_progress(crate::progress::loading(path.display().to_string()));
    let engine = weft::rt::block_on(builder.build())?;
    if engine.tokenizer().chat_template().is_none() {
        return Err(WeftError::model(
            path.display().to_string(),
            "has no chat template, so it cannot chat; use `weft generate` instead",
        ));
    }
    let interactive = std::io::stdin().is_terminal();
    let base: Vec<ChatMessage> = opts.system.map(ChatMessage::system).into_iter().collect();
    let mut history = base.clone();
    if interactive {
        eprintln!("chatting with {}; /reset forgets the conversation, /exit (or Ctrl-D) quits", path.display());
    }
    let stdout = std::io::stdout();
    let mut lines = std::io::stdin().lock().lines();
    loop {
        if interactive {
            let mut out = stdout.lock();
            let _ = out.write_all(b"> ");
            let _ = out.flush();
        }
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|e| WeftError::Unsupported(format!("could not read stdin: {e}")))?;
        let text = line.trim();
        match text {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history = base.clone();
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::user(text));
        let params = GenerationParams {
            sampling: opts.sampling.clone(),
            max_tokens: Some(opts.max_tokens),
            ..Default::default()
        };
        let request = InferenceRequest::new(Prompt::Chat(history.clone()), params);
        let result = crate::generate::stream_to_stdout(&engine, request);
        let streamed = match result {
            Ok(streamed) => streamed,
            Err(e) => {
                // Keep the conversation usable: drop the message that failed, say why, go on.
                println!();
                history.pop();
                eprintln!("error: {e}");
                continue;
            }
        };
        eprintln!("[{}]", crate::generate::speeds("reply", streamed.usage, streamed.started, streamed.first_token_at));
        history.push(ChatMessage::assistant(streamed.text));
    }
    Ok(())
}
