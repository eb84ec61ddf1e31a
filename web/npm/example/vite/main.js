// The five lines a web developer writes, around a page state the browser test waits on.
import { createEngine } from 'weft-llm';

const q = new URLSearchParams(location.search);
const out = document.getElementById('out');
try {
  const engine = await createEngine({ modelUrl: q.get('model'), storage: 'none' });
  const reply = await engine.chat.completions.create({
    messages: [{ role: 'user', content: q.get('prompt') }],
    max_tokens: Number(q.get('maxTokens')),
    temperature: 0,
  });
  out.textContent = reply.choices[0].message.content;
  document.body.dataset.state = 'done';
  await engine.dispose();
} catch (e) {
  out.textContent = String(e?.stack ?? e);
  document.body.dataset.state = 'error';
}
