// The openai npm package's Responses client over HTTP: a plain create, a streamed one, a
// 5-turn previous_response_id chain, text.format json_schema and a forced tool call.
// Prints one JSON line with what each produced.
// Usage: node responses_node.mjs BASE_URL (http://HOST:PORT/v1)
import OpenAI from 'openai';

const [baseURL] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0 });
const fast = { model: 'default', max_output_tokens: 24, temperature: 0 };
const weather = {
  type: 'object', additionalProperties: false, required: ['city', 'days'],
  properties: { city: { type: 'string', maxLength: 20 },
                days: { type: 'integer', minimum: 1, maximum: 9 } } };

const plain = await client.responses.create({ input: 'Name a colour.', ...fast });

let streamed = '';
const kinds = [];
const stream = await client.responses.create({ input: 'Name a fruit.', stream: true, ...fast });
for await (const event of stream) {
  kinds.push(event.type);
  if (event.type === 'response.output_text.delta') streamed += event.delta;
}

let previous = null;
const inputs = [];
for (let turn = 0; turn < 5; turn++) {
  const r = await client.responses.create({
    input: `Remember the number ${turn}.`, previous_response_id: previous, ...fast });
  inputs.push(r.usage.input_tokens);
  previous = r.id;
}

const structured = await client.responses.create({
  input: 'Weather in Rome for 2 days, as JSON.', ...fast, max_output_tokens: 48,
  text: { format: { type: 'json_schema', name: 'weather', schema: weather, strict: true } } });

const called = await client.responses.create({
  input: 'Weather in Rome for 2 days?', ...fast, max_output_tokens: 48,
  tools: [{ type: 'function', name: 'get_weather', parameters: weather, strict: true }],
  tool_choice: { type: 'function', name: 'get_weather' } });
const call = called.output.find((item) => item.type === 'function_call');

console.log(JSON.stringify({
  plain: plain.output_text, plain_status: plain.status, streamed, kinds, inputs,
  structured: structured.output_text, call: call && { name: call.name, arguments: call.arguments },
}));
