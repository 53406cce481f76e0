/**
 * The request rules the real server (`startServer`, real sockets, real PostgreSQL) enforces are
 * stated in the `/openapi.json` it serves: a client generated from the document validates what it
 * sends with the document's schemas, so a rule stated nowhere is a 400 that client cannot foresee
 * (review r53b found nine). Each case is refused by the server and by the document's schema (Ajv,
 * draft 2020-12); a rule JSON Schema cannot state (one field compared with another, or with store
 * time) is refused by the server and named in the schema's description. Also: the headers the
 * server sends are documented.
 */
import {
  ERROR_STATUS,
  JSON_MAX_DEPTH,
  LABEL_KEY_MAX_BYTES,
  LABEL_VALUE_MAX_BYTES,
  MAX_SUBMIT_DELAY_MS,
} from '@ledgence/contracts';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { beforeAll, describe, expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

// biome-ignore lint/suspicious/noExplicitAny: replies and the document are read loosely
type Loose = any;

const KEY = 'oarules-acme-all-key-000001';
const KEY_CONFIG = [
  { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker', 'admin'] },
];
const server = keyedServer('oarules', { LEDGENCE_API_KEYS: JSON.stringify(KEY_CONFIG) });

const scope = { tenant_id: 'acme', namespace: 'rules' };
const SCOPE = '/v1/tenants/{tenant_id}/namespaces/{namespace}';
const TASKS_T = `${SCOPE}/tasks`;
const tasks = `/v1/tenants/${scope.tenant_id}/namespaces/${scope.namespace}/tasks`;

const token = (text: string) => text.replace(/~/g, '~0').replace(/\//g, '~1');

let doc: Loose;
let ajv: Ajv2020;

beforeAll(async () => {
  doc = await (await fetch(`${server.url}/openapi.json`)).json();
  ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: false });
  ajv.addSchema({ ...doc, $id: 'openapi.json' });
});

/** Whether the document's schema of the submit route's body accepts `body`. */
function documentAccepts(body: unknown): boolean {
  const ref = `openapi.json#/paths/${token(TASKS_T)}/post/requestBody/content/application~1json/schema`;
  const validate = ajv.getSchema(ref) ?? ajv.compile({ $ref: ref });
  return validate(body) as boolean;
}

/** The documented parameter `name` (in `where`) of `method template`. */
function parameter(method: string, template: string, where: string, name: string): Loose {
  return (doc.paths[template][method].parameters ?? []).find(
    (p: Loose) => p.in === where && p.name === name,
  );
}

interface Reply {
  status: number;
  headers: Headers;
  body: Loose;
}

async function send(method: string, path: string, json?: unknown, headers = {}): Promise<Reply> {
  const res = await fetch(`${server.url}${path}`, {
    method,
    headers: {
      authorization: `Bearer ${KEY}`,
      ...(json === undefined ? {} : { 'content-type': 'application/json' }),
      ...headers,
    },
    body: json === undefined ? undefined : JSON.stringify(json),
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, body: text ? JSON.parse(text) : undefined };
}

let counter = 0;
function submit(extra: Record<string, unknown> = {}, trace?: unknown) {
  counter += 1;
  return {
    idempotency_key: `rules-${counter}`,
    input: { ...scope, queue: 'q', program: { name: 'p' }, data: { n: counter }, ...extra },
    ...(trace === undefined ? {} : { origin_trace: trace }),
  };
}

/** For each case: [the server's status, whether the document accepts it]. */
async function verdicts(cases: [name: string, body: unknown][]) {
  const out: Record<string, [number, boolean]> = {};
  for (const [name, body] of cases) {
    out[name] = [(await send('POST', tasks, body)).status, documentAccepts(body)];
  }
  return out;
}

/** Every case refused by the server (400) and by the document. */
const allRefused = (cases: [string, unknown][]) =>
  Object.fromEntries(cases.map(([name]) => [name, [400, false]]));

describe('request rules the server enforces are stated by the document', () => {
  it('labels: key and value byte bounds, empty text and reserved keys', async () => {
    const cases: [string, unknown][] = [
      [
        `a label value of ${LABEL_VALUE_MAX_BYTES + 1} bytes`,
        submit({ labels: { team: 'v'.repeat(LABEL_VALUE_MAX_BYTES + 1) } }),
      ],
      [
        `a label key of ${LABEL_KEY_MAX_BYTES + 1} bytes`,
        submit({ labels: { ['k'.repeat(LABEL_KEY_MAX_BYTES + 1)]: 'v' } }),
      ],
      ['an empty label value', submit({ labels: { team: '' } })],
      ['an empty label key', submit({ labels: { '': 'v' } })],
      ['the label key constructor', submit({ labels: { constructor: 'v' } })],
    ];
    expect(await verdicts(cases)).toEqual(allRefused(cases));
    // The bounds themselves are taken by both.
    const edge = submit({
      labels: { ['k'.repeat(LABEL_KEY_MAX_BYTES)]: 'v'.repeat(LABEL_VALUE_MAX_BYTES) },
    });
    expect(await verdicts([['both at their bound', edge]])).toEqual({
      'both at their bound': [201, true],
    });
  });

  it('submit: the cross-field rules of SubmitTask and RetryPolicy that JSON Schema can state', async () => {
    const cases: [string, unknown][] = [
      ['available_at with delay_ms', submit({ available_at: Date.now(), delay_ms: 10 })],
      ['concurrency_limit without concurrency_key', submit({ concurrency_limit: 2 })],
      [
        'exponential backoff without max_delay_ms',
        submit({ retry: { max_attempts: 2, delay_ms: 10, backoff: 'exponential' } }),
      ],
      [
        'exponential backoff with delay_ms 0',
        submit({
          retry: { max_attempts: 2, delay_ms: 0, backoff: 'exponential', max_delay_ms: 5 },
        }),
      ],
      [
        'fixed backoff with a max_delay_ms',
        submit({ retry: { max_attempts: 2, delay_ms: 10, backoff: 'fixed', max_delay_ms: 20 } }),
      ],
    ];
    expect(await verdicts(cases)).toEqual(allRefused(cases));
    // `null` stands for "not given" (DESIGN §4.1): these are taken by both.
    const taken: [string, unknown][] = [
      ['available_at with a null delay_ms', submit({ available_at: Date.now(), delay_ms: null })],
      ['a null concurrency_limit', submit({ concurrency_limit: null })],
      [
        'fixed backoff with max_delay_ms 0',
        submit({ retry: { max_attempts: 2, delay_ms: 10, backoff: 'fixed', max_delay_ms: 0 } }),
      ],
    ];
    expect(await verdicts(taken)).toEqual(
      Object.fromEntries(taken.map(([name]) => [name, [201, true]])),
    );
  });

  it('submit: the rules JSON Schema cannot state are refused and described', async () => {
    const day = 86_400_000;
    let deep: unknown = 1;
    for (let i = 0; i <= JSON_MAX_DEPTH; i += 1) deep = [deep];
    const cases: [string, unknown][] = [
      ['available_at 400 days ahead', submit({ available_at: Date.now() + 400 * day })],
      [
        'exponential backoff with max_delay_ms < delay_ms',
        submit({
          retry: { max_attempts: 2, delay_ms: 10, backoff: 'exponential', max_delay_ms: 5 },
        }),
      ],
      [`data nested ${JSON_MAX_DEPTH + 1} deep`, submit({ data: deep })],
      ['data holding 2^53', submit({ data: { n: 2 ** 53 } })],
    ];
    const statuses = await verdicts(cases);
    expect(Object.values(statuses).map(([status]) => status)).toEqual(cases.map(() => 400));
    const schemas = doc.components.schemas;
    const retry = schemas.SubmitTask.properties.retry.anyOf[0];
    expect({
      availableAt: schemas.SubmitTask.description,
      retry: retry.description,
      data: schemas.SubmitTask.properties.data.description,
    }).toEqual({
      availableAt: expect.stringContaining(`at most ${MAX_SUBMIT_DELAY_MS} ms`),
      retry: expect.stringContaining('1 ≤ delay_ms ≤ max_delay_ms'),
      data: expect.stringMatching(new RegExp(`at most ${JSON_MAX_DEPTH} levels.*2\\^53−1`)),
    });
  });

  it('trace contexts: a traceparent of the W3C shape, a tracestate of at most 512 characters', async () => {
    const valid = `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01`;
    const cases: [string, unknown][] = [
      ['origin_trace.traceparent "x"', submit({}, { traceparent: 'x' })],
      ['an uppercase traceparent', submit({}, { traceparent: valid.toUpperCase() })],
      [
        'a tracestate of 513 characters',
        submit({}, { traceparent: valid, tracestate: `k=${'v'.repeat(511)}` }),
      ],
    ];
    expect(await verdicts(cases)).toEqual(allRefused(cases));
    expect(await verdicts([['a valid one', submit({}, { traceparent: valid })]])).toEqual({
      'a valid one': [201, true],
    });
  });

  it('integers written as 1.0, 1e2 or -0 (integers by JSON Schema) are taken', async () => {
    const out: Record<string, [number, boolean]> = {};
    for (const text of ['1e2', '1.0', '-0']) {
      const raw = JSON.stringify(submit({ priority: 7 })).replace(
        '"priority":7',
        `"priority":${text}`,
      );
      const res = await fetch(`${server.url}${tasks}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
        body: raw,
      });
      out[text] = [res.status, documentAccepts(JSON.parse(raw))];
    }
    expect(out).toEqual({ '1e2': [201, true], '1.0': [201, true], '-0': [201, true] });
  });

  it('path parameters: tenant_id, namespace and task_id are 1..128-byte text', async () => {
    const T = `${SCOPE}/tasks/{task_id}`;
    const long = 'x'.repeat(129);
    const out: Record<string, [number, boolean]> = {};
    for (const [name, path] of [
      ['task_id', `${tasks}/${long}`],
      ['namespace', `/v1/tenants/acme/namespaces/${long}/tasks/x`],
      ['tenant_id', `/v1/tenants/${long}/namespaces/rules/tasks/x`],
    ] as const) {
      const schema = parameter('get', T, 'path', name).schema;
      out[name] = [(await send('GET', path)).status, ajv.validate(schema, long)];
    }
    // 403 for a tenant the key is not bound to is the authorization's answer, after the decoding
    // (DESIGN §4.1: decoding before 403): 400 it is.
    expect(out).toEqual({
      task_id: [400, false],
      namespace: [400, false],
      tenant_id: [400, false],
    });
  });

  it('list query: queue, program and workflow_id filters are 1..128-byte text', async () => {
    const out: Record<string, [number, boolean]> = {};
    for (const [name, value] of [
      ['queue', 'q'.repeat(129)],
      ['program', 'p'.repeat(129)],
      ['workflow_id', 'w'.repeat(129)],
      ['queue', ''],
    ] as const) {
      const schema = parameter('get', TASKS_T, 'query', name).schema;
      const status = (await send('GET', `${tasks}?${name}=${value}`)).status;
      out[`${name} of ${value.length}`] = [status, ajv.validate(schema, value)];
    }
    expect(out).toEqual({
      'queue of 129': [400, false],
      'program of 129': [400, false],
      'workflow_id of 129': [400, false],
      'queue of 0': [400, false],
    });
  });
});

describe('headers the server sends are documented', () => {
  it('X-Request-Id: on every reply of every operation, and taken on every request', async () => {
    const reply = await send('POST', tasks, submit(), { 'x-request-id': 'trace-me.1' });
    expect([reply.status, reply.headers.get('x-request-id')]).toEqual([201, 'trace-me.1']);
    const missing: string[] = [];
    for (const [path, operations] of Object.entries<Loose>(doc.paths)) {
      for (const [method, operation] of Object.entries<Loose>(operations)) {
        const names = (operation.parameters ?? []).map((p: Loose) => p.name);
        if (!names.includes('X-Request-Id')) missing.push(`${method} ${path} request`);
        for (const [status, response] of Object.entries<Loose>(operation.responses)) {
          if (!('X-Request-Id' in (response.headers ?? {}))) {
            missing.push(`${method} ${path} ${status}`);
          }
        }
      }
    }
    expect(missing).toEqual([]);
    const kept = parameter('post', TASKS_T, 'header', 'X-Request-Id').schema;
    expect([ajv.validate(kept, 'trace-me.1'), ajv.validate(kept, 'has space')]).toEqual([
      true,
      false,
    ]);
  });

  it('Accept-Encoding on a 415 content_encoding refusal', async () => {
    const reply = await send('POST', tasks, submit(), { 'content-encoding': 'gzip' });
    expect([reply.status, reply.body.reason, reply.headers.get('accept-encoding')]).toEqual([
      415,
      'content_encoding',
      'identity',
    ]);
    const refused = doc.paths[TASKS_T].post.responses[String(ERROR_STATUS.unsupported_media_type)];
    expect(Object.keys(refused.headers ?? {})).toContain('Accept-Encoding');
  });
});
