/**
 * JSON semantics of idempotent replays over the real server (raw bytes on a real
 * socket, real PostgreSQL). DESIGN §1.3 / §5: the same identity with the same canonical command
 * replays (200, the stored answer); with another command it is 409; bad JSON is a 400 with a
 * problem code and writes nothing; nothing is ever a 5xx (§6).
 */
import { describe, expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

const KEY = 'json-acme-star-key-0000000001';
const server = keyedServer('json_replays', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker', 'admin'] },
  ]),
  LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
    billing: {
      url: 'http://127.0.0.1:9/never',
      secret: `whsec_${Buffer.alloc(24, 7).toString('base64')}`,
    },
  }),
  LEDGENCE_LEASE_DURATION_MS: '600000',
  LEDGENCE_CLEANUP_GRACE_MS: '600000',
});

// biome-ignore lint/suspicious/noExplicitAny: replies are read loosely
type Loose = any;

let counter = 0;
const fresh = (prefix: string) => `${prefix}-${++counter}-${Date.now()}`;
const scopePath = (ns: string) => `/v1/tenants/acme/namespaces/${ns}`;

function post(path: string, body: string | Buffer, headers: Record<string, string> = {}) {
  return server.send<Loose>({
    method: 'POST',
    path,
    key: KEY,
    headers: { 'content-type': 'application/json', ...headers },
    body,
  });
}

async function count(ns: string): Promise<number> {
  const page = await server.call(KEY, 'GET', `${scopePath(ns)}/tasks?limit=500`);
  expect(page.status).toBe(200);
  return page.body.tasks.length;
}

/** A submit command's text with `data` and extra input members spliced in as given. */
function submitText(ns: string, key: string, data: string, extra = '', keyText?: string): string {
  return `{"idempotency_key":${keyText ?? JSON.stringify(key)},"input":{"tenant_id":"acme","namespace":${JSON.stringify(ns)},"queue":"q","program":{"name":"p"},"data":${data}${extra}}}`;
}

/** A task taken through acquire and a dispatch renew, for settle and renew replays. */
async function running(ns: string) {
  const queue = fresh('q');
  const scope = { tenant_id: 'acme', namespace: ns };
  const submitted = await server.call(KEY, 'POST', `${scopePath(ns)}/tasks`, {
    idempotency_key: fresh('k'),
    input: { tenant_id: 'acme', namespace: ns, queue, program: { name: 'p' }, data: 1 },
  });
  expect(submitted.status).toBe(201);
  const session = await server.call(KEY, 'POST', '/v1/worker/sessions', {
    scope,
    queue,
    concurrency: 1,
  });
  expect(session.status).toBe(200);
  const poll = { scope, queue, worker_session_id: session.body.id, consumer_id: 0, sequence: 1 };
  const acquired = await server.call(KEY, 'POST', '/v1/worker/acquire', poll);
  expect(acquired.body.disposition).toBe('assigned');
  const owner = acquired.body.assignment.lease.owner;
  const renewed = await server.call(KEY, 'POST', '/v1/worker/renew', {
    owner,
    sequence: 1,
    intent: 'dispatch',
  });
  expect(renewed.status).toBe(200);
  return { owner, task_id: submitted.body.task_id as string, poll };
}

function settleText(owner: Loose, operation: string, output: string, trailer = ''): string {
  return `{"owner":${JSON.stringify(owner)},"operation_id":${JSON.stringify(operation)},"report":{"kind":"completed","report":{"context":{"identity":{"task_id":${JSON.stringify(owner.task_id)},"attempt_id":${JSON.stringify(owner.attempt_id)}}},"outcome":{"kind":"success","output":${output}}}},"quiescence":"confirmed"${trailer}}`;
}

describe('submit: bad JSON is 400 with a code and writes nothing (DESIGN §1.4, §4.1)', () => {
  it('BOM, trailing data, NaN/Infinity, duplicate keys, lone surrogates, bad UTF-8: 400 invalid_input, no task', async () => {
    const ns = fresh('bad');
    const good = submitText(ns, 'k', '1');
    const bodies: [string, string | Buffer][] = [
      ['bom', Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(good)])],
      ['trailing value', `${good} {}`],
      ['trailing second object', `${good}${good}`],
      ['trailing garbage', `${good}x`],
      ['trailing comma', `${good},`],
      ['trailing NUL', `${good}\u0000`],
      ['NaN', submitText(ns, 'k', 'NaN')],
      ['Infinity', submitText(ns, 'k', 'Infinity')],
      ['-Infinity', submitText(ns, 'k', '-Infinity')],
      ['1e309 (Infinity as a number)', submitText(ns, 'k', '1e309')],
      ['-1e400', submitText(ns, 'k', '-1e400')],
      ['1.7976931348623157e308', submitText(ns, 'k', '1.7976931348623157e308')],
      ['2^53 as 9.007199254740992e15', submitText(ns, 'k', '9.007199254740992e15')],
      ['duplicate data key', submitText(ns, 'k', '{"a":1,"a":2}')],
      ['duplicate data key, escaped spelling', submitText(ns, 'k', '{"a":1,"\\u0061":1}')],
      [
        'duplicate idempotency_key',
        `{"idempotency_key":"k","idempotency_key":"k2","input":{"tenant_id":"acme","namespace":${JSON.stringify(ns)},"queue":"q","program":{"name":"p"},"data":1}}`,
      ],
      ['duplicate input member', submitText(ns, 'k', '1', ',"queue":"q"')],
      ['lone high surrogate escape', submitText(ns, 'k', '"\\ud800"')],
      ['lone low surrogate escape', submitText(ns, 'k', '"\\udc00x"')],
      ['reversed pair', submitText(ns, 'k', '"\\ude00\\ud83d"')],
      [
        'CESU-8 surrogate bytes',
        Buffer.alloc(0), // filled in below
      ],
      ['single quotes', submitText(ns, 'k', "'a'")],
      ['leading zero', submitText(ns, 'k', '01')],
      ['plus sign', submitText(ns, 'k', '+1')],
      ['bare dot', submitText(ns, 'k', '.5')],
      ['hex', submitText(ns, 'k', '0x10')],
      ['comment', submitText(ns, 'k', '1 /* c */')],
      ['raw control character in a string', submitText(ns, 'k', '"a\tb"')],
      ['__proto__ key', submitText(ns, 'k', '{"__proto__":{"x":1}}')],
      ['escaped __proto__ key', submitText(ns, 'k', '{"\\u005f_proto__":{"x":1}}')],
      ['empty object member', submitText(ns, 'k', '{,}')],
      ['unterminated', good.slice(0, -1)],
    ];
    // The CESU-8 case: replace the X with ED A0 80 (a surrogate encoded in three bytes).
    const cesu = bodies.find(([name]) => name === 'CESU-8 surrogate bytes');
    if (cesu !== undefined) {
      const text = submitText(ns, 'k', '"X"');
      const at = text.indexOf('"X"') + 1;
      cesu[1] = Buffer.concat([
        Buffer.from(text.slice(0, at)),
        Buffer.from([0xed, 0xa0, 0x80]),
        Buffer.from(text.slice(at + 1)),
      ]);
    }
    const seen: Record<string, [number, string]> = {};
    for (const [name, body] of bodies) {
      const reply = await post(`${scopePath(ns)}/tasks`, body);
      seen[name] = [reply.status, reply.body?.code];
    }
    const expected = Object.fromEntries(bodies.map(([name]) => [name, [400, 'invalid_input']]));
    expect(seen).toEqual(expected);
    expect(await count(ns)).toBe(0);
  });

  it('surrounding JSON whitespace (space, tab, CR, LF) is accepted and replays', async () => {
    const ns = fresh('ws');
    const first = await post(`${scopePath(ns)}/tasks`, ` \t\r\n${submitText(ns, 'k', '1')}\r\n\t `);
    expect(first.status).toBe(201);
    const again = await post(`${scopePath(ns)}/tasks`, submitText(ns, 'k', '1'));
    expect([again.status, again.body.task_id]).toEqual([200, first.body.task_id]);
    // Non-JSON whitespace (NBSP, a vertical tab, a form feed) around the value is not JSON.
    for (const pad of ['\u00a0', '\u000b', '\u000c', '\u3000']) {
      const reply = await post(`${scopePath(ns)}/tasks`, `${pad}${submitText(ns, 'k2', '1')}`);
      expect([pad, reply.status, reply.body.code]).toEqual([pad, 400, 'invalid_input']);
    }
    expect(await count(ns)).toBe(1);
  });
});

describe('submit: the same command spelled differently replays (DESIGN §5)', () => {
  it('escapes in the key and in input text, number spellings of integer fields and data', async () => {
    const ns = fresh('spell');
    const first = await post(
      `${scopePath(ns)}/tasks`,
      submitText(
        ns,
        'k/é-😀',
        '{"url":"a/b","t":"é😀","f":[1e-7,5e-324,0.1,100,-0]}',
        ',"priority":10,"timeout_ms":300000,"labels":{"lé":"v/é"},"retry":{"max_attempts":3,"delay_ms":1000}',
      ),
    );
    expect(first.status).toBe(201);
    const variants = [
      submitText(
        ns,
        '',
        '{"f":[0.0000001,4.9406564584124654e-324,1e-1,1E2,0],"t":"\\u00E9\\uD83D\\uDE00","url":"a\\/b"}',
        ',"labels":{"l\\u00e9":"v\\/\\u00e9"},"retry":{"delay_ms":1e3,"max_attempts":3.0},"timeout_ms":3E5,"priority":10.0',
        '"k\\/\\u00e9-\\ud83d\\ude00"',
      ),
      submitText(
        ns,
        '',
        '{"f":[10E-8,5E-324,0.10,1.00e2,-0.0e0],"t":"é\\ud83d\\ude00","url":"a/b"}',
        ',"priority":1e1,"timeout_ms":300000.000,"labels":{"lé":"v/é"},"retry":{"max_attempts":30e-1,"delay_ms":1000}',
        '"k/\\u00e9-😀"',
      ),
    ];
    for (const body of variants) {
      const again = await post(`${scopePath(ns)}/tasks`, body);
      expect([again.status, again.body.task_id, again.body.input?.data]).toEqual([
        200,
        first.body.task_id,
        first.body.input.data,
      ]);
    }
    expect(await count(ns)).toBe(1);
  });

  it('a different number in data (2^53−1 vs 2^53−2, 0.1 vs 0.10000000000000002) is 409 and writes nothing', async () => {
    const ns = fresh('num');
    const first = await post(
      `${scopePath(ns)}/tasks`,
      submitText(ns, 'k', '[9007199254740991,0.1]'),
    );
    expect(first.status).toBe(201);
    for (const data of ['[9007199254740990,0.1]', '[9007199254740991,0.10000000000000002]']) {
      const reply = await post(`${scopePath(ns)}/tasks`, submitText(ns, 'k', data));
      expect([data, reply.status, reply.body.code]).toEqual([data, 409, 'conflict']);
    }
    // ...but the same value spelled with an exponent replays.
    const same = await post(
      `${scopePath(ns)}/tasks`,
      submitText(ns, 'k', '[9.007199254740991e15,1e-1]'),
    );
    expect([same.status, same.body.task_id]).toEqual([200, first.body.task_id]);
    expect(await count(ns)).toBe(1);
  });

  it('an Idempotency-Key header and a body key with escapes name the same task', async () => {
    const ns = fresh('hdr');
    const body = submitText(ns, 'key/é', '{"a":1}');
    const first = await post(`${scopePath(ns)}/tasks`, body);
    expect(first.status).toBe(201);
    const noKey = `{"input":{"data":{"a":1.0},"program":{"name":"p"},"queue":"q","namespace":${JSON.stringify(ns)},"tenant_id":"acme"}}`;
    const viaHeader = await server.send<Loose>({
      method: 'POST',
      path: `${scopePath(ns)}/tasks`,
      key: KEY,
      headers: {
        'content-type': 'application/json',
        // UTF-8 bytes, one per latin1 character, as a client like curl sends them.
        'idempotency-key': Buffer.from('key/é', 'utf8').toString('latin1'),
      },
      // A Buffer body: node:http writes a string first chunk together with the header block in
      // the chunk's encoding (UTF-8), which would encode the latin1 header characters twice.
      body: Buffer.from(noKey),
    });
    expect([viaHeader.status, viaHeader.body.idempotency_key, viaHeader.body.task_id]).toEqual([
      200,
      first.body.idempotency_key,
      first.body.task_id,
    ]);
    // The header and an explicit null body key together are still two sources: refused.
    const both = await post(
      `${scopePath(ns)}/tasks`,
      noKey.replace('{"input"', '{"idempotency_key":null,"input"'),
      { 'idempotency-key': 'key2' },
    );
    expect([both.status, both.body.code]).toEqual([400, 'invalid_input']);
    expect(await count(ns)).toBe(1);
  });
});

describe('tasks:batch items replay like single submits', () => {
  it('an item spelled differently replays a single submit; a differing item is its own 409; a bad JSON item is its own 400', async () => {
    const ns = fresh('batch');
    const first = await post(`${scopePath(ns)}/tasks`, submitText(ns, 'k1', '{"x":[1,"é"]}'));
    expect(first.status).toBe(201);
    const batch = `{"commands":[${submitText(ns, 'k1', '{"x":[1.0e0,"\\u00e9"]}')},${submitText(ns, 'k1', '{"x":[2,"é"]}')},${submitText(ns, 'k3', '{"d":1,"d":1}')},${submitText(ns, 'k4', '1e400')},${submitText(ns, 'k5', '"\\udfff"')},${submitText(ns, 'k6', '1')}]}`;
    const reply = await post(`${scopePath(ns)}/tasks:batch`, batch);
    expect(reply.status).toBe(200);
    const results = reply.body.results as Loose[];
    expect(results.map((r) => r.task_id ?? r.code)).toEqual([
      first.body.task_id,
      'conflict',
      'invalid_input',
      'invalid_input',
      'invalid_input',
      results[5]?.task_id,
    ]);
    expect(typeof results[5]?.task_id).toBe('string');
    expect(await count(ns)).toBe(2);
  });

  it('a batch body with trailing data, a BOM or a duplicate commands key fails whole and writes nothing', async () => {
    const ns = fresh('batchbad');
    const inner = `{"commands":[${submitText(ns, 'k1', '1')}]}`;
    for (const body of [
      `${inner}x`,
      `${inner}${inner}`,
      Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(inner)]),
      `{"commands":[${submitText(ns, 'k1', '1')}],"commands":[${submitText(ns, 'k2', '1')}]}`,
      `{"commands":[${submitText(ns, 'k1', '1')}],"extra":{"a":1,"a":2}}`,
      `{"commands":[${submitText(ns, 'k1', '1')}], "x": NaN}`,
    ]) {
      const reply = await post(`${scopePath(ns)}/tasks:batch`, body);
      expect([reply.status, reply.body.code]).toEqual([400, 'invalid_input']);
    }
    expect(await count(ns)).toBe(0);
  });
});

describe('settle: operation_id replays compare the canonical command (DESIGN §5 Settle)', () => {
  it('key order, whitespace, number spellings and escapes in output replay already_accepted; other output is 409', async () => {
    const ns = fresh('settle');
    const { owner } = await running(ns);
    const op = 'op/é';
    const first = await post(
      '/v1/worker/settle',
      settleText(owner, op, '{"b":[1,0.5,1e-7],"a":"é😀/","c":null}'),
    );
    expect(first.status).toBe(200);
    expect(first.body.already_accepted).toBe(false);
    const variants = [
      settleText(
        owner,
        op,
        ' { "c" : null , "a" : "\\u00e9\\ud83d\\ude00\\/" , "b" : [ 1.0 , 5e-1 , 0.0000001 ] } ',
        ',"processing_trace":null',
      ),
      settleText(owner, 'op/\\u00e9', '{"a":"é😀/","b":[10E-1,0.50,100e-9],"c":null}').replace(
        '"operation_id":"op/\\\\u00e9"',
        '"operation_id":"op\\/\\u00e9"',
      ),
    ];
    for (const body of variants) {
      const again = await post('/v1/worker/settle', body);
      expect([again.status, again.body.already_accepted, again.body.receipt]).toEqual([
        200,
        true,
        first.body.receipt,
      ]);
    }
    const other = await post(
      '/v1/worker/settle',
      settleText(owner, op, '{"a":"é😀/","b":[1,0.5,1e-7]}'),
    );
    expect([other.status, other.body.code]).toEqual([409, 'conflict']);
    const dup = await post('/v1/worker/settle', settleText(owner, op, '{"a":1,"a":1}'));
    expect([dup.status, dup.body.code]).toEqual([400, 'invalid_input']);
  });

  it('settle:batch replays a single settle spelled differently', async () => {
    const ns = fresh('settleb');
    const { owner } = await running(ns);
    const first = await post('/v1/worker/settle', settleText(owner, 'op-1', '[1,{"y":2,"x":1}]'));
    expect(first.status).toBe(200);
    const batch = `{"commands":[${settleText(owner, 'op-1', '[1e0,{"x":1.0,"y":2e0}]')},${settleText(owner, 'op-1', '[1,{"x":1,"y":3}]')},${settleText(owner, 'op-1', '[1,{"x":1,"x":1}]')}]}`;
    const reply = await post('/v1/worker/settle:batch', batch);
    expect(reply.status).toBe(200);
    const [same, other, bad] = reply.body.results as Loose[];
    expect([same.already_accepted, same.receipt]).toEqual([true, first.body.receipt]);
    expect([other.status, other.code]).toEqual([409, 'conflict']);
    expect([bad.status, bad.code]).toEqual([400, 'invalid_input']);
  });
});

describe('renew and acquire replays spelled differently', () => {
  it('renew: sequence 1.0 / 1e0 with keys reordered replays; acquire: sequence 10E-1 replays the same assignment', async () => {
    const ns = fresh('renew');
    const { owner, poll } = await running(ns);
    const renew = `{"intent":"dispatch","sequence":1e0,"owner":${JSON.stringify(owner)}}`;
    const again = await post('/v1/worker/renew', renew);
    expect([again.status, again.body.renew_sequence]).toEqual([200, 1]);
    const other = await post(
      '/v1/worker/renew',
      `{"intent":"keep_alive","sequence":1.0,"owner":${JSON.stringify(owner)}}`,
    );
    expect([other.status, other.body.code]).toEqual([409, 'conflict']);
    const acquire = JSON.stringify({ ...poll, sequence: 1 }).replace(
      '"sequence":1',
      '"sequence":10E-1',
    );
    const replay = await post('/v1/worker/acquire', acquire);
    expect([replay.status, replay.body.disposition, replay.body.assignment?.lease?.owner]).toEqual([
      200,
      'assigned',
      owner,
    ]);
  });
});

describe('completion subscriptions: subscription_key replays spelled differently', () => {
  it('escaped key and reordered members replay (200, the same subscription); another destination is 409', async () => {
    const ns = fresh('sub');
    const submitted = await server.call(KEY, 'POST', `${scopePath(ns)}/tasks`, {
      idempotency_key: fresh('k'),
      input: { tenant_id: 'acme', namespace: ns, queue: 'q', program: { name: 'p' }, data: 1 },
    });
    const path = `${scopePath(ns)}/tasks/${submitted.body.task_id}/completion-subscriptions`;
    const first = await post(path, '{"subscription_key":"s/é","destination":"billing"}');
    expect(first.status).toBe(201);
    const again = await post(
      path,
      ' {"destination":"bill\\u0069ng","subscription_key":"s\\/\\u00e9"} ',
    );
    expect([again.status, again.body.id]).toEqual([200, first.body.id]);
    const dup = await post(
      path,
      '{"subscription_key":"s/é","subscription_key":"s2","destination":"billing"}',
    );
    expect([dup.status, dup.body.code]).toEqual([400, 'invalid_input']);
    const list = await server.call(KEY, 'GET', path);
    expect(list.body.length).toBe(1);
  });
});

describe('bodies a route only allows (cancel, extend): bad JSON is 400 and changes nothing', () => {
  it('cancel with a BOM, trailing data, duplicate keys, whitespace only or NaN leaves the task queued', async () => {
    const ns = fresh('cancel');
    const submitted = await server.call(KEY, 'POST', `${scopePath(ns)}/tasks`, {
      idempotency_key: fresh('k'),
      input: { tenant_id: 'acme', namespace: ns, queue: 'q', program: { name: 'p' }, data: 1 },
    });
    const path = `${scopePath(ns)}/tasks/${submitted.body.task_id}/cancel`;
    const seen: unknown[] = [];
    for (const body of [
      Buffer.from([0xef, 0xbb, 0xbf, 0x7b, 0x7d]),
      '{} {}',
      '{}x',
      '{"a":1,"a":1}',
      '   ',
      '[]',
      'null',
      '{"x":NaN}',
      '"\\ud800"',
    ]) {
      const reply = await post(path, body);
      seen.push([String(body), reply.status, reply.body?.code]);
    }
    expect(seen.every((s) => (s as unknown[])[1] === 400)).toBe(true);
    const status = await server.call(
      KEY,
      'GET',
      `${scopePath(ns)}/tasks/${submitted.body.task_id}`,
    );
    expect(status.body.state).toBe('queued');
  });
});

describe('hostile number literals are 400, never 5xx', () => {
  it('a number of 1 MiB of digits, a huge exponent, an exponent of many digits', async () => {
    const ns = fresh('hostile');
    const cases = [
      '9'.repeat(1024 * 1024),
      `0.${'0'.repeat(1024 * 1024)}1`,
      `9007199254740991.${'0'.repeat(1024 * 1024)}1`,
      '1e99999999999999999999999999',
      `1e${'9'.repeat(100_000)}`,
      `1e-${'9'.repeat(100_000)}`,
      '-',
      '1.',
      '1e',
      '1e+',
      '-01',
      '--1',
    ];
    const seen: unknown[] = [];
    for (const [i, data] of cases.entries()) {
      const reply = await post(`${scopePath(ns)}/tasks`, submitText(ns, `k${i}`, data));
      seen.push([i, reply.status, reply.body?.code]);
    }
    // Literals that underflow to 0 (cases 1 and 5) are within ±(2^53−1) and accepted as 0 (IEEE
    // rounding, as RFC 8785 canonical form works on doubles); everything else is a 400.
    expect(seen).toEqual(
      cases.map((_, i) => (i === 1 || i === 5 ? [i, 201, undefined] : [i, 400, 'invalid_input'])),
    );
  });
});

describe('settle replays spelled differently inside one batch and in concurrent requests', () => {
  it('settle:batch: one attempt twice in one batch, the second spelled differently, is already_accepted', async () => {
    const ns = fresh('settlein');
    const { owner } = await running(ns);
    const batch = `{"commands":[${settleText(owner, 'op-in', '{"b":[1,2],"a":"é"}')},${settleText(owner, 'op-in', '{"a":"\\u00e9","b":[1.0,2e0]}')},${settleText(owner, 'op-in', '{"a":"é","b":[1,3]}')}]}`;
    const reply = await post('/v1/worker/settle:batch', batch);
    expect(reply.status).toBe(200);
    const [first, second, third] = reply.body.results as Loose[];
    expect(first.already_accepted).toBe(false);
    expect([second.already_accepted, second.receipt]).toEqual([true, first.receipt]);
    expect([third.status, third.code]).toEqual([409, 'conflict']);
  });

  it('concurrent settles of one attempt spelled differently: one accepted, the rest already_accepted, none 409 or 5xx', async () => {
    const ns = fresh('settleconc');
    const { owner } = await running(ns);
    const spellings = [
      '{"b":[1,2],"a":"é"}',
      '{"a":"\\u00e9","b":[1.0,2e0]}',
      ' { "b" : [ 10E-1 , 0.2e1 ] , "a" : "é" } ',
      '{"a":"é","b":[1,2]}',
      '{"b":[1.00,2.00],"a":"\\u00E9"}',
      '{"a":"é","b":[100e-2,20e-1]}',
    ];
    const replies = await Promise.all(
      spellings.flatMap((output, i) => [
        post('/v1/worker/settle', settleText(owner, 'op-conc', output)),
        post(
          '/v1/worker/settle:batch',
          `{"commands":[${settleText(owner, 'op-conc', spellings[(i + 1) % spellings.length] as string)}]}`,
        ),
      ]),
    );
    const answers = replies.map((r) => {
      const item = r.body.results === undefined ? r.body : r.body.results[0];
      return [r.status, item.already_accepted ?? item.code];
    });
    expect(answers.filter(([, a]) => a === false)).toHaveLength(1);
    expect(answers.filter(([s, a]) => s === 200 && a === true)).toHaveLength(answers.length - 1);
  });
});

describe('concurrent first submits and subscribes spelled differently', () => {
  it('single and batch submits of one key, spelled differently, racing: one task, one 201, the rest 200', async () => {
    const ns = fresh('race');
    const spellings = [
      '{"a":[1,"é"],"b":null}',
      '{"b":null,"a":[1.0,"\\u00e9"]}',
      ' { "a" : [ 1e0 , "é" ] , "b" : null } ',
      '{"a":[10E-1,"\\u00E9"],"b":null}',
    ];
    const replies = await Promise.all(
      spellings.flatMap((data) => [
        post(`${scopePath(ns)}/tasks`, submitText(ns, 'race-key', data)),
        post(`${scopePath(ns)}/tasks:batch`, `{"commands":[${submitText(ns, 'race-key', data)}]}`),
      ]),
    );
    const answers = replies.map((r) =>
      r.body.results === undefined
        ? [r.status, r.body.task_id ?? r.body.code]
        : [
            r.body.results[0].task_id ? 'item' : r.body.results[0].status,
            r.body.results[0].task_id ?? r.body.results[0].code,
          ],
    );
    const ids = new Set(answers.map(([, id]) => id));
    expect([ids.size, answers.every(([s]) => s === 200 || s === 201 || s === 'item')]).toEqual([
      1,
      true,
    ]);
    expect(answers.filter(([s]) => s === 201).length).toBeLessThanOrEqual(1);
    expect(await count(ns)).toBe(1);
  });

  it('subscribes of one key spelled differently, racing: one subscription, 201 once and 200 for the rest', async () => {
    const ns = fresh('subrace');
    const submitted = await server.call(KEY, 'POST', `${scopePath(ns)}/tasks`, {
      idempotency_key: fresh('k'),
      input: { tenant_id: 'acme', namespace: ns, queue: 'q', program: { name: 'p' }, data: 1 },
    });
    const path = `${scopePath(ns)}/tasks/${submitted.body.task_id}/completion-subscriptions`;
    const bodies = [
      '{"subscription_key":"s-é","destination":"billing"}',
      '{"destination":"billing","subscription_key":"s-\\u00e9"}',
      ' { "subscription_key" : "s\\u002d\\u00E9" , "destination" : "b\\u0069lling" } ',
      '{"subscription_key":"s-é","destination":"billing"}',
    ];
    const replies = await Promise.all([...bodies, ...bodies].map((body) => post(path, body)));
    const statuses = replies.map((r) => r.status).sort();
    expect(statuses.filter((s) => s === 201)).toHaveLength(1);
    expect(statuses.filter((s) => s === 200)).toHaveLength(replies.length - 1);
    expect(new Set(replies.map((r) => r.body.id)).size).toBe(1);
    const list = await server.call(KEY, 'GET', path);
    expect(list.body.length).toBe(1);
  });
});
