// openai_client.mjs: the official `openai` npm package (a client nobody here
// wrote) against djinnd --http on the demo model: models, completions and chat,
// streamed and not, logprobs, fresh and given seeds, vLLM's top_k, text parts,
// logit_bias, tool calls (forced, streamed, parsed by the SDK, a second turn),
// and its typed errors (400 naming refused and unknown fields, 401, 404).
// usage: node openai_client.mjs OPENAI_PACKAGE_DIR BASE_URL TOKEN
import { pathToFileURL } from 'node:url';

const [pkg, baseURL, token] = process.argv.slice(2);
const { default: OpenAI } = await import(pathToFileURL(`${pkg}/index.mjs`).href);
const client = new OpenAI({ baseURL, apiKey: token, maxRetries: 0, timeout: 60000 });
let pass = 0, fail = 0;
const check = (ok, what) => { if (ok) pass++; else { fail++; console.error(`FAIL: ${what}`); } };

async function expectError(cls, status, needle, what, call) {
    try {
        await call();
        check(false, `${what}: no error`);
    } catch (e) {
        check(e instanceof cls && e.status === status && String(e.message).includes(needle),
              `${what}: got ${e.constructor.name} ${e.status} '${e.message}', want ${cls.name} ${status} with '${needle}'`);
    }
}

// models
const models = [];
for await (const m of client.models.list()) models.push(m.id);
check(models.includes('demo') && models.includes('demo-chat'), `models: ${models}`);

// completions: greedy, then the same streamed
const prompt = 'Once upon a time';
const c = await client.completions.create({ model: 'demo', prompt, max_tokens: 8, temperature: 0, logprobs: 2 });
const text = c.choices[0].text;
check(c.object === 'text_completion' && text.length > 0, `completion: '${text}'`);
check(c.usage.completion_tokens === 8 && c.choices[0].finish_reason === 'length', `completion usage ${JSON.stringify(c.usage)}`);
check(c.choices[0].logprobs.tokens.length === 8 && c.choices[0].logprobs.tokens.join('') === text,
      `completion logprobs: ${JSON.stringify(c.choices[0].logprobs.tokens)}`);
let streamed = '';
for await (const ch of await client.completions.create({ model: 'demo', prompt, max_tokens: 8, temperature: 0, stream: true }))
    streamed += ch.choices[0]?.text ?? '';
check(streamed === text, `completion stream '${streamed}' vs '${text}'`);

// chat: greedy with logprobs, then streamed with usage
const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello there' }];
const r = await client.chat.completions.create({ model: 'demo-chat', messages, max_completion_tokens: 10, temperature: 0,
                                                  logprobs: true, top_logprobs: 2 });
const content = r.choices[0].message.content;
check(r.object === 'chat.completion' && r.choices[0].message.role === 'assistant' && content.length > 0, `chat: '${content}'`);
const lp = r.choices[0].logprobs.content;
check(lp.length === r.usage.completion_tokens && lp.every(e => e.top_logprobs.length === 2 && e.logprob <= 0),
      `chat logprobs: ${JSON.stringify(lp).slice(0, 200)}`);
let chatStreamed = '', usage = null, finish = null;
const stream = await client.chat.completions.create({ model: 'demo-chat', messages, max_completion_tokens: 10,
                                                       temperature: 0, stream: true, stream_options: { include_usage: true } });
for await (const ch of stream) {
    chatStreamed += ch.choices[0]?.delta?.content ?? '';
    finish = ch.choices[0]?.finish_reason ?? finish;
    if (ch.usage) usage = ch.usage;
}
check(chatStreamed === content, `chat stream '${chatStreamed}' vs '${content}'`);
check(usage && usage.completion_tokens === r.usage.completion_tokens && finish !== null, `chat stream usage ${JSON.stringify(usage)}`);

// sampling: no seed draws a fresh one, reported as "seed", which repeats the answer
const sampled = [];
for (let i = 0; i < 6; i++)
    sampled.push(await client.completions.create({ model: 'demo', prompt, max_tokens: 12, temperature: 1 }));
check(sampled.every(s => Number.isSafeInteger(s.seed)) && new Set(sampled.map(s => s.seed)).size === 6,
      `fresh seeds: ${sampled.map(s => s.seed)}`);
check(new Set(sampled.map(s => s.choices[0].text)).size >= 4, `unseeded texts: ${JSON.stringify(sampled.map(s => s.choices[0].text))}`);
const again = await client.completions.create({ model: 'demo', prompt, max_tokens: 12, temperature: 1, seed: sampled[0].seed });
check(again.choices[0].text === sampled[0].choices[0].text, `seed ${sampled[0].seed} again: '${again.choices[0].text}'`);
// vLLM's fields: top_k 1 at temperature 1.5 is the greedy answer
const topk = await client.completions.create({ model: 'demo', prompt, max_tokens: 8, temperature: 1.5, top_k: 1 });
check(topk.choices[0].text === text, `top_k 1: '${topk.choices[0].text}' vs greedy '${text}'`);
// content as text parts, joined by "\n"
const parts = await client.chat.completions.create({ model: 'demo-chat', max_completion_tokens: 10, temperature: 0,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Hello' }, { type: 'text', text: 'there' }] }] });
const joined = await client.chat.completions.create({ model: 'demo-chat', max_completion_tokens: 10, temperature: 0,
    messages: [{ role: 'user', content: 'Hello\nthere' }] });
check(parts.choices[0].message.content === joined.choices[0].message.content, `parts vs joined`);

// structured output, parsed by the client's own parser (chat.completions.parse)
const person = { type: 'object', properties: { name: { type: 'string' }, age: { type: 'integer' },
                 tags: { type: 'array', items: { enum: ['a', 'b'] }, maxItems: 3 } },
                 required: ['name', 'age', 'tags'], additionalProperties: false };
for (let i = 0; i < 5; i++) {
    const p = await client.chat.completions.parse({ model: 'demo-chat', messages, max_completion_tokens: 120,
        temperature: 1, seed: 20 + i, response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: person } } });
    const v = p.choices[0].message.parsed;
    check(v && typeof v.name === 'string' && Number.isInteger(v.age) && Array.isArray(v.tags) && v.tags.length <= 3 &&
          v.tags.every(t => t === 'a' || t === 'b') && Object.keys(v).length === 3, `parsed: ${JSON.stringify(v)}`);
}
const jo = await client.chat.completions.create({ model: 'demo-chat', messages, max_completion_tokens: 80, temperature: 0,
                                                  response_format: { type: 'json_object' } });
let joValue = null;
try { joValue = JSON.parse(jo.choices[0].message.content); } catch { /* checked below */ }
check(joValue !== null && typeof joValue === 'object' && !Array.isArray(joValue), `json_object: '${jo.choices[0].message.content}'`);
await expectError(OpenAI.BadRequestError, 400, "'format'", 'a schema keyword outside the subset',
                  () => client.chat.completions.create({ model: 'demo-chat', messages, response_format: { type: 'json_schema',
                      json_schema: { name: 'd', schema: { type: 'string', format: 'date' } } } }));

// logit_bias: +100 on one id makes every greedy token that id
const forced = await client.completions.create({ model: 'demo', prompt: [1, 15, 27], max_tokens: 5, temperature: 0,
                                                 logit_bias: { '60': 100 }, logprobs: 0 });
check(forced.choices[0].logprobs.tokens.length === 5 && new Set(forced.choices[0].logprobs.tokens).size === 1,
      `logit_bias +100: ${JSON.stringify(forced.choices[0].logprobs.tokens)}`);

// tools: a forced call (named, then required) arrives as tool_calls whose arguments the SDK's parser reads
const weather = { type: 'function', function: { name: 'get_weather', description: 'Weather of a city', strict: true,
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } },
                  required: ['city', 'days'], additionalProperties: false } } };
const clock = { type: 'function', function: { name: 'get_time', strict: true,
    parameters: { type: 'object', properties: { zone: { enum: ['UTC', 'CET'] } }, required: ['zone'],
                  additionalProperties: false } } };
const ask = [{ role: 'user', content: 'Weather in Oslo?' }];
const named = await client.chat.completions.parse({ model: 'demo-chat', messages: ask, tools: [weather, clock], seed: 7,
    temperature: 1, max_completion_tokens: 200, tool_choice: { type: 'function', function: { name: 'get_weather' } } });
const call = named.choices[0].message.tool_calls?.[0];
check(named.choices[0].finish_reason === 'tool_calls' && call?.function.name === 'get_weather' &&
      typeof call.function.parsed_arguments?.city === 'string' && Number.isInteger(call.function.parsed_arguments?.days),
      `named tool call: ${JSON.stringify(named.choices[0])}`);
const req = await client.chat.completions.create({ model: 'demo-chat', messages: ask, tools: [weather, clock], seed: 8,
    temperature: 1, max_completion_tokens: 300, tool_choice: 'required' });
const calls = req.choices[0].message.tool_calls ?? [];
check(calls.length >= 1 && calls.every(c => ['get_weather', 'get_time'].includes(c.function.name) &&
      typeof JSON.parse(c.function.arguments) === 'object'), `required tool calls: ${JSON.stringify(calls)}`);
// streamed: the SDK's stream helper accumulates the deltas into the same call
const runner = client.chat.completions.stream({ model: 'demo-chat', messages: ask, tools: [weather, clock], seed: 7,
    temperature: 1, max_completion_tokens: 200, tool_choice: { type: 'function', function: { name: 'get_weather' } } });
const done = await runner.finalChatCompletion();
const scall = done.choices[0].message.tool_calls?.[0];
check(scall?.function.name === 'get_weather' && scall.function.arguments === call?.function.arguments &&
      done.choices[0].finish_reason === 'tool_calls', `streamed tool call: ${JSON.stringify(done.choices[0])}`);
// the second turn: the call and the tool's answer sent back
const turn2 = await client.chat.completions.create({ model: 'demo-chat', tools: [weather, clock], max_completion_tokens: 8,
    temperature: 0, messages: [...ask, named.choices[0].message, { role: 'tool', tool_call_id: call?.id ?? 'x', content: 'rain' }] });
check(turn2.choices[0].message.role === 'assistant', `second turn: ${JSON.stringify(turn2.choices[0])}`);
await expectError(OpenAI.BadRequestError, 400, "'tool_choice.function.name'", 'a named function not in tools',
                  () => client.chat.completions.create({ model: 'demo-chat', messages: ask, tools: [weather],
                      tool_choice: { type: 'function', function: { name: 'nope' } } }));

// a model by id, with what djinnd knows of it
const dm = await client.models.retrieve('demo-chat');
check(dm.id === 'demo-chat' && dm.owned_by === 'djinnd' && dm.max_model_len === 512, `models.retrieve: ${JSON.stringify(dm)}`);
await expectError(OpenAI.NotFoundError, 404, "'nope'", 'models.retrieve of an unknown model', () => client.models.retrieve('nope'));

// errors, as the SDK's typed exceptions
await expectError(OpenAI.BadRequestError, 400, '[0, 2]', 'temperature 5',
                  () => client.completions.create({ model: 'demo', prompt, temperature: 5 }));
await expectError(OpenAI.BadRequestError, 400, 'top_logprobs', 'top_logprobs 21',
                  () => client.chat.completions.create({ model: 'demo-chat', messages, logprobs: true, top_logprobs: 21 }));
await expectError(OpenAI.NotFoundError, 404, 'model store', 'unknown model',
                  () => client.chat.completions.create({ model: 'no-such-model', messages }));
await expectError(OpenAI.BadRequestError, 400, "'logit_bias.5'", 'logit_bias 101',
                  () => client.chat.completions.create({ model: 'demo-chat', messages, logit_bias: { '5': 101 } }));
await expectError(OpenAI.BadRequestError, 400, 'logit_bias names token id 99999', 'logit_bias past the vocabulary',
                  () => client.chat.completions.create({ model: 'demo-chat', messages, logit_bias: { '99999': 1 } }));
await expectError(OpenAI.BadRequestError, 400, "'n'", 'n 2',
                  () => client.chat.completions.create({ model: 'demo-chat', messages, n: 2 }));
await expectError(OpenAI.BadRequestError, 400, "'frobnicate'", 'an unknown field',
                  () => client.chat.completions.create({ model: 'demo-chat', messages, frobnicate: true }));
await expectError(OpenAI.BadRequestError, 400, "'image_url'", 'an image part',
                  () => client.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user',
                      content: [{ type: 'image_url', image_url: { url: 'https://example.com/a.png' } }] }] }));
const stranger = new OpenAI({ baseURL, apiKey: 'wrong-token', maxRetries: 0 });
await expectError(OpenAI.AuthenticationError, 401, 'Bearer', 'wrong token',
                  () => stranger.completions.create({ model: 'demo', prompt }));

console.log(`openai_client: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
