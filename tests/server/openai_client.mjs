// End-to-end check with the real `openai` npm client: completions and chat, streaming and not,
// routed_experts decoded from base64 .npy and checked for shape, dtype and valid distinct ids;
// routes asked for per request (return_routed_experts), streamed per chunk (stream_routed_experts)
// and reassembled to equal the non-streamed answer, gating weights (float16) likewise.
// Usage: node openai_client.mjs --base-url URL --deps DIR [--api-key K] [--prompt TEXT] [--no-chat 1]
// Prints one JSON summary line; exits 1 (after printing every failure) if any check fails.
import { createRequire } from 'node:module';

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
const deps = args.deps;
if (!deps) {
  console.error('--deps DIR (the node_modules folder from scripts/setup.sh) is required');
  process.exit(2);
}
let OpenAI;
try {
  const loaded = createRequire(deps + '/')('openai');
  OpenAI = loaded.OpenAI ?? loaded.default ?? loaded;
} catch (e) {
  console.error(`cannot load the openai package from ${deps}: run scripts/setup.sh (${e.message})`);
  process.exit(2);
}

const failures = [];
const check = (condition, message) => { if (!condition) failures.push(message); };
const client = new OpenAI({ baseURL: args['base-url'], apiKey: args['api-key'] ?? 'none', maxRetries: 0 });
const prompt = args.prompt ?? 'The capital of France is';

// A .npy file (format 1.x/2.x) -> {dtype, shape, data: TypedArray}.
function decodeNpy(base64) {
  const bytes = Buffer.from(base64, 'base64');
  if (bytes.subarray(0, 6).toString('latin1') !== '\x93NUMPY') throw new Error('not a .npy file');
  const major = bytes[6];
  const headerLength = major === 1 ? bytes.readUInt16LE(8) : bytes.readUInt32LE(8);
  const headerStart = major === 1 ? 10 : 12;
  const header = bytes.subarray(headerStart, headerStart + headerLength).toString('latin1');
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').map((s) => s.trim()).filter(Boolean).map(Number);
  if (/'fortran_order':\s*True/.test(header)) throw new Error('fortran order');
  const body = bytes.subarray(headerStart + headerLength);
  const copy = new Uint8Array(body).buffer;
  // '<f2' (gating weights) is compared bit for bit, so its raw 16-bit words will do.
  const data = descr === '|u1' ? new Uint8Array(copy) : descr === '<u2' || descr === '<f2' ? new Uint16Array(copy) : null;
  if (!data) throw new Error(`unexpected dtype ${descr}`);
  return { dtype: descr, shape, data };
}

function checkRoutes(label, base64, rows, model) {
  if (typeof base64 !== 'string') {
    failures.push(`${label}: routed_experts missing`);
    return;
  }
  const routes = decodeNpy(base64);
  const layers = model.num_hidden_layers;
  const topK = model.top_k;
  check(routes.dtype === (model.num_experts <= 256 ? '|u1' : '<u2'), `${label}: dtype ${routes.dtype}`);
  check(JSON.stringify(routes.shape) === JSON.stringify([rows, layers, topK]),
        `${label}: shape ${JSON.stringify(routes.shape)}, expected [${rows}, ${layers}, ${topK}]`);
  const moe = new Set(model.moe_layers);
  for (let r = 0; r < routes.shape[0]; r++) {
    for (let l = 0; l < layers; l++) {
      const ids = Array.from(routes.data.subarray((r * layers + l) * topK, (r * layers + l + 1) * topK));
      if (moe.has(l)) {
        if (new Set(ids).size !== topK || ids.some((e) => e >= model.num_experts)) {
          failures.push(`${label}: row ${r} layer ${l} ids ${ids} are not ${topK} distinct ids < ${model.num_experts}`);
          return;
        }
      } else if (ids.some((e) => e !== 0)) {
        failures.push(`${label}: dense layer ${l} row ${r} is not zero: ${ids}`);
        return;
      }
    }
  }
}

// Streamed pieces of one choice -> {shape, data} of their rows in order (first_row contiguous).
function joinPieces(label, pieces) {
  let rows = 0;
  let shape = null;
  const parts = [];
  for (const piece of pieces) {
    check(piece.first_row === rows, `${label}: piece starts at row ${piece.first_row}, expected ${rows}`);
    const array = decodeNpy(piece.npy);
    shape = array.shape;
    rows += array.shape[0];
    parts.push(array.data);
  }
  const length = parts.reduce((n, p) => n + p.length, 0);
  const data = parts.length && parts[0] instanceof Uint8Array ? new Uint8Array(length) : new Uint16Array(length);
  let at = 0;
  for (const p of parts) { data.set(p, at); at += p.length; }
  return { shape: shape ? [rows, shape[1], shape[2]] : null, data };
}

function sameArray(label, joined, base64) {
  if (typeof base64 !== 'string') { failures.push(`${label}: non-streamed answer missing`); return; }
  const whole = decodeNpy(base64);
  check(JSON.stringify(joined.shape) === JSON.stringify(whole.shape),
        `${label}: joined shape ${JSON.stringify(joined.shape)} != ${JSON.stringify(whole.shape)}`);
  check(joined.data.length === whole.data.length && joined.data.every((v, i) => v === whole.data[i]),
        `${label}: joined rows differ from the non-streamed answer`);
}

// Opt in per request: the server's default may be either way.
const routed = { return_routed_experts: true };
const summary = {};
try {
  const models = await client.models.list();
  const model = models.data[0];
  check(Array.isArray(model.moe_layers) && model.moe_layers.length > 0, 'models: moe_layers missing');
  check(model.num_experts > 0 && model.top_k > 0, 'models: num_experts/top_k missing');
  summary.model = { id: model.id, moe_layers: model.moe_layers.length, num_experts: model.num_experts, top_k: model.top_k };

  // Completions, not streaming and streaming (greedy: same text).
  const completion = await client.completions.create({ model: model.id, prompt, max_tokens: 8, temperature: 0, ...routed });
  const c0 = completion.choices[0];
  check(typeof c0.text === 'string', 'completions: text');
  check(['length', 'stop'].includes(c0.finish_reason), `completions: finish_reason ${c0.finish_reason}`);
  const cRows = completion.usage.prompt_tokens + completion.usage.completion_tokens - 1;
  checkRoutes('completions', c0.routed_experts, cRows, model);
  summary.completion = { text: c0.text, usage: completion.usage };

  const stream = await client.completions.create({ model: model.id, prompt, max_tokens: 8, temperature: 0, stream: true,
                                                   stream_options: { include_usage: true }, ...routed });
  let streamedText = '';
  let streamedRoutes = null;
  let streamedUsage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) streamedUsage = chunk.usage;
    for (const choice of chunk.choices) {
      streamedText += choice.text;
      if (choice.finish_reason) streamedRoutes = choice.routed_experts;
      else check(choice.routed_experts === undefined, 'completions stream: routes before the final chunk');
    }
  }
  check(streamedText === c0.text, `completions stream: text ${JSON.stringify(streamedText)} != ${JSON.stringify(c0.text)}`);
  check(streamedRoutes === c0.routed_experts, 'completions stream: routes differ from non-streaming');
  check(streamedUsage && streamedUsage.completion_tokens === completion.usage.completion_tokens, 'completions stream: usage');
  summary.completion_stream = { chunks };

  // Asked not to: no routes.
  const without = await client.completions.create({ model: model.id, prompt, max_tokens: 2, return_routed_experts: false });
  check(without.choices[0].routed_experts === undefined, 'completions: routes although return_routed_experts: false');

  // Streamed routes (and weights where the server has them): every chunk carries its rows; the
  // pieces in order equal the non-streamed answer, from routed_experts_start on.
  const weights = model.routed_experts_weights === true;
  const extra = { ...routed, routed_experts_start: 2, ...(weights ? { return_routed_experts_weights: true } : {}) };
  const whole = await client.completions.create({ model: model.id, prompt, max_tokens: 6, temperature: 0, ...extra });
  if (weights) check(typeof whole.choices[0].routed_experts_weights === 'string', 'completions: weights missing');
  const pieces = { ids: [], weights: [] };
  let pieceChunks = 0;
  const routeStream = await client.completions.create({ model: model.id, prompt, max_tokens: 6, temperature: 0, stream: true,
                                                        stream_routed_experts: true, ...extra });
  for await (const chunk of routeStream) {
    for (const choice of chunk.choices) {
      if (choice.routed_experts === undefined) continue;
      pieceChunks++;
      pieces.ids.push({ first_row: choice.routed_experts_first_row - 2, npy: choice.routed_experts });
      if (weights) pieces.weights.push({ first_row: choice.routed_experts_first_row - 2, npy: choice.routed_experts_weights });
    }
  }
  check(pieceChunks >= 2, `completions stream_routed_experts: ${pieceChunks} chunks with routes`);
  sameArray('completions stream_routed_experts', joinPieces('completions pieces', pieces.ids), whole.choices[0].routed_experts);
  if (weights)
    sameArray('completions stream weights', joinPieces('weight pieces', pieces.weights), whole.choices[0].routed_experts_weights);
  summary.streamed_routes = { chunks: pieceChunks, weights };

  // n = 2, seeded: two choices, each with its own routes whose prompt rows are identical.
  const pair = await client.completions.create({ model: model.id, prompt, max_tokens: 4, n: 2, seed: 1234, temperature: 1, ...routed });
  check(pair.choices.length === 2, 'completions n=2: two choices');
  const promptTokens = pair.usage.prompt_tokens;
  const pairRoutes = pair.choices.map((choice) => {
    check(typeof choice.routed_experts === 'string', `completions n=2: choice ${choice.index} routes`);
    return decodeNpy(choice.routed_experts ?? '');
  });
  if (pairRoutes.length === 2) {
    const promptValues = promptTokens * model.num_hidden_layers * model.top_k;
    const same = pairRoutes[0].data.subarray(0, promptValues).every((v, i) => v === pairRoutes[1].data[i]);
    check(same, 'completions n=2: prompt rows differ between choices');
  }

  if (!args['no-chat']) {
    // Chat, not streaming and streaming.
    const messages = [{ role: 'user', content: 'Say hello.' }];
    const chat = await client.chat.completions.create({ model: model.id, messages, max_tokens: 8, temperature: 0, ...routed });
    const m0 = chat.choices[0];
    check(m0.message.role === 'assistant', 'chat: role');
    check(typeof m0.message.content === 'string', 'chat: content');
    checkRoutes('chat', m0.routed_experts, chat.usage.prompt_tokens + chat.usage.completion_tokens - 1, model);
    summary.chat = { content: m0.message.content, usage: chat.usage };

    const chatStream = await client.chat.completions.create({ model: model.id, messages, max_tokens: 8, temperature: 0,
                                                             stream: true, ...routed });
    let chatText = '';
    let chatRoutes = null;
    let sawRole = false;
    for await (const chunk of chatStream) {
      for (const choice of chunk.choices) {
        if (choice.delta.role === 'assistant') sawRole = true;
        chatText += choice.delta.content ?? '';
        if (choice.finish_reason) chatRoutes = choice.routed_experts;
      }
    }
    check(sawRole, 'chat stream: no role delta');
    check(chatText === m0.message.content, `chat stream: text ${JSON.stringify(chatText)} != ${JSON.stringify(m0.message.content)}`);
    check(chatRoutes === m0.routed_experts, 'chat stream: routes differ from non-streaming');

    const chatPieces = [];
    const chatRouteStream = await client.chat.completions.create({ model: model.id, messages, max_tokens: 8, temperature: 0,
                                                                  stream: true, stream_routed_experts: true });
    for await (const chunk of chatRouteStream) {
      for (const choice of chunk.choices)
        if (choice.routed_experts !== undefined) chatPieces.push({ first_row: choice.routed_experts_first_row, npy: choice.routed_experts });
    }
    sameArray('chat stream_routed_experts', joinPieces('chat pieces', chatPieces), m0.routed_experts);
  } else {
    summary.chat = 'skipped (--no-chat)';
  }

  // Errors surface as the client's typed errors with the parameter named.
  try {
    await client.completions.create({ model: model.id, prompt, temperature: 5 });
    failures.push('temperature 5 was accepted');
  } catch (e) {
    check(e.status === 400, `temperature 5: status ${e.status}`);
    check(e.error?.param === 'temperature' || /temperature/.test(e.message), `temperature 5: ${e.message}`);
  }
  try {
    await client.completions.create({ model: 'no-such-model', prompt });
    failures.push('unknown model was accepted');
  } catch (e) {
    check(e.status === 404, `unknown model: status ${e.status}`);
  }
} catch (e) {
  failures.push(`unexpected: ${e.stack ?? e}`);
}

summary.failures = failures;
console.log(JSON.stringify(summary));
process.exit(failures.length ? 1 : 0);
