// Must NOT compile: `cargo xtask test-web` runs tsc on this file and expects it to fail, naming
// each misspelled property below. If these calls ever compile, the types have gone slack
// (say, to `any`) and would let typos through.

import { createEngine } from 'weft-llm';

const engine = await createEngine({ modelURL: '/models/model.gguf' });
await engine.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], max_token: 8, stream: true });
