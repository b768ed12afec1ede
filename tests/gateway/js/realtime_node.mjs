// Two turns over /v1/realtime with the openai npm package's realtime WebSocket client
// (OpenAIRealtimeWS, on the `ws` package). Prints one JSON line: the session id, each
// turn's text and usage, and every event type seen, in order.
// Usage: node realtime_node.mjs BASE_URL (https://HOST:PORT/v1; the client speaks wss)
import OpenAI from 'openai';
import { OpenAIRealtimeWS } from 'openai/realtime/ws';

const [baseURL] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.TOKENWIRE_KEY ?? 'unused' });
const rt = new OpenAIRealtimeWS({ model: 'default' }, client);
const seen = [];
const waiting = new Map(); // event type -> resolve of the one waiting for it

rt.on('event', (event) => {
  seen.push(event.type);
  waiting.get(event.type)?.(event);
});
rt.on('error', (err) => {
  console.error('realtime error:', err?.message ?? err);
  process.exit(2);
});

function next(type) {
  return new Promise((resolve) => waiting.set(type, resolve));
}

async function turn(text) {
  const done = next('response.done');
  rt.send({ type: 'conversation.item.create', item: {
    type: 'message', role: 'user', content: [{ type: 'input_text', text }] } });
  rt.send({ type: 'response.create' });
  const event = await done;
  const item = event.response.output[0];
  return { text: item.content[0].text, status: event.response.status, usage: event.response.usage };
}

const timer = setTimeout(() => { console.error('timed out'); process.exit(3); }, 120000);
const created = await next('session.created');
rt.send({ type: 'session.update', session: {
  type: 'realtime', instructions: 'Answer in one short sentence.', max_output_tokens: 16,
  temperature: 0 } });
await next('session.updated');
const turns = [await turn('What is the capital of France?'), await turn('And of Germany?')];
rt.close();
clearTimeout(timer);
console.log(JSON.stringify({ session_id: created.session.id, turns, types: seen }));
