/**
 * Malformed bodies across every route that takes one (every POST, and the
 * admin PUT): each is answered 4xx with a problem+json code, never reaches
 * a service, changes nothing in the store, and never comes back in the reply.
 */
import {
  BATCH_MAX_BYTES,
  COMPLETION_COMMAND_MAX_BYTES,
  CONTROL_REQUEST_MAX_BYTES,
  DISPATCH_MAX_BYTES,
  ERROR_CODES,
  MIN_RETENTION_MS,
  SETTLEMENT_MAX_BYTES,
  SUBMISSION_MAX_BYTES,
} from '@ledgence/contracts';
import { beforeAll, describe, expect, it } from 'vitest';
import {
  ACME_DEV,
  ACME_PROD,
  acquireBody,
  assignTask,
  createHarness,
  GLOBEX_PROD,
  type Harness,
  KEYS,
  policyPath,
  redeliverPath,
  scopePath,
  settleBody,
  submitBody,
  submitTask,
  subscribeBody,
  subscriptionsPath,
} from './testdata/harness.js';

/** Never to be found in any reply. */
const MARKER = 'ZQXMARK7731';

interface BodyRoute {
  name: string;
  /** Default POST. */
  method?: 'PUT';
  path: string;
  limit: number;
  /** A valid body (as a value), to mutate. */
  valid: unknown;
  /** Whether the route needs a body (empty is then 400); cancel and extend do not. */
  required: boolean;
}

interface Case {
  route: string;
  variant: string;
  method: string;
  path: string;
  body: Uint8Array;
  contentType: string | undefined;
}

const encoder = new TextEncoder();
const utf8 = (text: string) => encoder.encode(text);
const bytes = (...parts: (string | number[])[]) => {
  const chunks = parts.map((p) => (typeof p === 'string' ? utf8(p) : Uint8Array.from(p)));
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.byteLength, 0));
  let at = 0;
  for (const chunk of chunks) {
    out.set(chunk, at);
    at += chunk.byteLength;
  }
  return out;
};

/** `text` with the first top-level value replaced by `replacement` (raw JSON). */
function replaceFirstValue(valid: unknown, replacement: string): string {
  const record = valid as Record<string, unknown>;
  const first = Object.keys(record)[0];
  if (first === undefined) return `{"zzz":${replacement}}`;
  const rest = Object.entries(record)
    .slice(1)
    .map(([k, val]) => `${JSON.stringify(k)}:${JSON.stringify(val)}`);
  return `{${[`${JSON.stringify(first)}:${replacement}`, ...rest].join(',')}}`;
}

/** Every malformed variant of `route`'s body. */
function variants(route: BodyRoute): Omit<Case, 'route' | 'method' | 'path'>[] {
  const text = JSON.stringify(route.valid);
  const json = 'application/json';
  const out: Omit<Case, 'route' | 'method' | 'path'>[] = [];
  const add = (variant: string, body: string | Uint8Array, contentType: string | null = json) =>
    out.push({
      variant,
      body: typeof body === 'string' ? utf8(body) : body,
      contentType: contentType ?? undefined,
    });

  // Truncated JSON, at several points.
  add('truncated after 1 byte', text.slice(0, 1));
  add('truncated in the middle', text.slice(0, Math.max(1, Math.floor(text.length / 2))));
  add('truncated before the end', text.slice(0, -1));
  add('truncated marker string', `{"zzz":"${MARKER}`);
  // Duplicate keys, scope fields included.
  const firstKey = Object.keys(route.valid as object)[0];
  if (firstKey !== undefined) {
    add('duplicate top-level key', text.replace('{', `{${JSON.stringify(firstKey)}:1,`));
  } else add('duplicate key', `{"a":"${MARKER}","a":"${MARKER}"}`);
  for (const [field, value] of [
    ['tenant_id', 'acme'],
    ['namespace', 'prod'],
  ] as const) {
    const pair = `"${field}":"${value}"`;
    if (text.includes(pair)) {
      add(`duplicate ${field} (same value)`, text.replace(pair, `${pair},${pair}`));
      add(`duplicate ${field} (other value)`, text.replace(pair, `${pair},"${field}":"${MARKER}"`));
    }
  }
  // Reserved keys.
  add(
    '__proto__ key',
    text.replace('{', `{"__proto__":{"polluted":"${MARKER}"},`).replace(',}', '}'),
  );
  add('constructor key', text.replace('{', '{"constructor":{"prototype":{}},').replace(',}', '}'));
  add('nested __proto__', `{"a":{"__proto__":"${MARKER}"}}`);
  // The first value replaced by values of the wrong type or out of range.
  for (const replacement of [
    '1e400',
    '9007199254740993',
    '-1e300',
    '123456789012345678901234567890',
    'true',
    '[]',
    `{"x":["${MARKER}"]}`,
  ]) {
    add(`first value ${replacement.slice(0, 24)}`, replaceFirstValue(route.valid, replacement));
  }
  // Unknown fields.
  // Unknown field names appear in the problem's path (the contracts name the
  // offending key); values never do, so markers go in values.
  add('unknown top-level field', text.replace('{', `{"zzz":"${MARKER}",`).replace(',}', '}'));
  add('unknown field only', `{"zzz":"${MARKER}"}`);
  // Deep nesting.
  add('deep arrays', '['.repeat(100_000) + ']'.repeat(100_000));
  add('deep objects', `${'{"a":'.repeat(5_000)}1${'}'.repeat(5_000)}`);
  add('deep inside a valid key', replaceFirstValue(route.valid, '['.repeat(200) + ']'.repeat(200)));
  // Over the limit by one byte.
  add('limit + 1 bytes', text + ' '.repeat(route.limit + 1 - Buffer.byteLength(text)));
  // Content types.
  add('text/plain', text, 'text/plain');
  add('form content type', text, 'application/x-www-form-urlencoded');
  add('problem+json content type', text, 'application/problem+json');
  add('multipart content type', text, 'multipart/form-data; boundary=x');
  add('json-like content type', text, 'application/jsonp');
  add('missing content type', text, null);
  // Invalid UTF-8 and BOMs.
  add('0xff byte', bytes('{"', [0xff], `":"${MARKER}"}`));
  add('overlong encoding', bytes(`{"a":"${MARKER}`, [0xc0, 0xaf], '"}'));
  add('encoded surrogate', bytes('{"a":"', [0xed, 0xa0, 0x80], '"}'));
  add('truncated multibyte', bytes('{"a":"', [0xe2, 0x82], '"}'));
  add('invalid byte in valid body', bytes(text.slice(0, 2), [0xfe], text.slice(2)));
  add('UTF-8 BOM', bytes([0xef, 0xbb, 0xbf], text));
  add('BOM character', `\ufeff${text}`);
  // JSON syntax that JSON.parse or JavaScript would accept, or that is plain wrong.
  add('trailing comma', text.replace(/}$/, ',}'));
  add('single quotes', `{'zzz':'${MARKER}'}`);
  if (text.includes('"')) add('single-quoted valid body', text.replaceAll('"', "'"));
  add('comment', `/* ${MARKER} */${text}`);
  add('NaN literal', replaceFirstValue(route.valid, 'NaN'));
  add('Infinity literal', replaceFirstValue(route.valid, 'Infinity'));
  add('-Infinity literal', replaceFirstValue(route.valid, '-Infinity'));
  add('lone surrogate escape', `{"a":"\\ud800${MARKER}"}`);
  add('raw control character', `{"a":"${MARKER}\u0001"}`);
  add('leading zero', replaceFirstValue(route.valid, '01'));
  add('hex number', replaceFirstValue(route.valid, '0x10'));
  add('trailing garbage', `${text}${MARKER}`);
  add('two documents', `${text}${text}`);
  add('whitespace only', '   \n ');
  // Non-object bodies.
  for (const body of ['[]', `"${MARKER}"`, '1', 'null', 'true', `[${text}]`]) {
    add(`non-object ${body.slice(0, 12)}`, body);
  }
  if (route.required) add('empty body', '');
  return out;
}

let h: Harness;
let routes: BodyRoute[];
let before: string;

beforeAll(async () => {
  h = createHarness();
  // Something to break: tasks in two scopes, a session and a live assignment.
  const { task, session, assignment } = await assignTask(h, ACME_PROD, KEYS.admin);
  const queued = await submitTask(h, ACME_PROD, KEYS.admin);
  await submitTask(h, ACME_DEV, KEYS.admin);
  const { subscription } = await h.completions.subscribe(
    ACME_PROD,
    queued.task_id,
    subscribeBody('malformed'),
  );
  const tasks = `${scopePath(ACME_PROD)}/tasks`;
  routes = [
    {
      name: 'submit',
      path: tasks,
      limit: SUBMISSION_MAX_BYTES,
      valid: submitBody(ACME_PROD, 'new'),
      required: true,
    },
    {
      name: 'submit batch',
      path: `${tasks}:batch`,
      limit: BATCH_MAX_BYTES,
      valid: { commands: [submitBody(ACME_PROD, 'new')] },
      required: true,
    },
    {
      name: 'cancel',
      path: `${tasks}/${queued.task_id}/cancel`,
      limit: CONTROL_REQUEST_MAX_BYTES,
      valid: {},
      required: false,
    },
    {
      name: 'subscribe',
      path: subscriptionsPath(ACME_PROD, queued.task_id),
      limit: COMPLETION_COMMAND_MAX_BYTES,
      valid: subscribeBody('new'),
      required: true,
    },
    {
      name: 'redeliver',
      path: redeliverPath(ACME_PROD, subscription.id),
      limit: COMPLETION_COMMAND_MAX_BYTES,
      valid: { generation: 1 },
      required: true,
    },
    {
      name: 'set retention policy',
      method: 'PUT',
      path: policyPath(ACME_PROD),
      limit: CONTROL_REQUEST_MAX_BYTES,
      valid: { retention_ms: MIN_RETENTION_MS },
      required: true,
    },
    {
      name: 'open session',
      path: '/v1/worker/sessions',
      limit: CONTROL_REQUEST_MAX_BYTES,
      valid: { scope: ACME_PROD, queue: 'email', concurrency: 1 },
      required: true,
    },
    {
      name: 'extend session',
      path: `/v1/worker/sessions/${session.id}/extend`,
      limit: CONTROL_REQUEST_MAX_BYTES,
      valid: { scope: ACME_PROD },
      required: false,
    },
    {
      name: 'acquire',
      path: '/v1/worker/acquire',
      limit: DISPATCH_MAX_BYTES,
      valid: acquireBody(session, 1, 1),
      required: true,
    },
    {
      name: 'acquire batch',
      path: '/v1/worker/acquire:batch',
      limit: BATCH_MAX_BYTES,
      valid: { commands: [acquireBody(session, 1, 1)] },
      required: true,
    },
    {
      name: 'renew',
      path: '/v1/worker/renew',
      limit: CONTROL_REQUEST_MAX_BYTES,
      valid: { owner: assignment.lease.owner, sequence: 1, intent: 'dispatch' },
      required: true,
    },
    {
      name: 'renew batch',
      path: '/v1/worker/renew:batch',
      limit: BATCH_MAX_BYTES,
      valid: { commands: [{ owner: assignment.lease.owner, sequence: 1, intent: 'dispatch' }] },
      required: true,
    },
    {
      name: 'settle',
      path: '/v1/worker/settle',
      limit: SETTLEMENT_MAX_BYTES,
      valid: settleBody(assignment),
      required: true,
    },
    {
      name: 'settle batch',
      path: '/v1/worker/settle:batch',
      limit: BATCH_MAX_BYTES,
      valid: { commands: [settleBody(assignment)] },
      required: true,
    },
    {
      name: 'quiescence',
      path: '/v1/worker/quiescence',
      limit: CONTROL_REQUEST_MAX_BYTES,
      valid: assignment.lease.owner,
      required: true,
    },
  ];
  expect(task.state).toBe('queued');
  before = await h.dump([ACME_PROD, ACME_DEV, GLOBEX_PROD]);
  for (const key of Object.keys(h.calls)) delete h.calls[key];
});

/** The item answers of a batch reply (`results` or `replies`), or `undefined` for another body. */
function batchItems(text: string): { status?: unknown; code?: unknown }[] | undefined {
  const body = JSON.parse(text) as { results?: unknown; replies?: unknown };
  const items = body.results ?? body.replies;
  return Array.isArray(items) ? items : undefined;
}

describe('malformed bodies on every route with a body', () => {
  it('covers every route of the app that takes a body', () => {
    const withBody = h.app.routes.filter((r) => r.method === 'POST' || r.method === 'PUT');
    const uncovered = withBody.filter((r) => {
      const pattern = new RegExp(`^${r.path.replace(/\/:[a-z_]+/g, '/[^/]+')}$`);
      return !routes.some(
        (route) => (route.method ?? 'POST') === r.method && pattern.test(route.path),
      );
    });
    expect(uncovered.map((r) => `${r.method} ${r.path}`)).toEqual([]);
  });

  it('rejects at least 300 malformed bodies with 4xx problems (per item in a batch) and changes nothing', async () => {
    const cases: Case[] = routes.flatMap((route) =>
      variants(route).map((v) => ({
        ...v,
        route: route.name,
        method: route.method ?? 'POST',
        path: route.path,
      })),
    );
    expect(cases.length).toBeGreaterThanOrEqual(300);
    const failures: string[] = [];
    const codes = new Map<string, number>();
    for (const c of cases) {
      const headers: Record<string, string> = { 'x-marker': MARKER };
      if (c.contentType !== undefined) headers['content-type'] = c.contentType;
      const res = await h.call(`${c.path}`, {
        method: c.method,
        key: KEYS.admin,
        body: c.body,
        headers,
      });
      const text = await res.text();
      let code: unknown;
      try {
        code = (JSON.parse(text) as { code?: unknown }).code;
      } catch {
        code = undefined;
      }
      const isProblem = (p: { status?: unknown; code?: unknown } | undefined) =>
        typeof p?.status === 'number' &&
        p.status >= 400 &&
        p.status < 500 &&
        typeof p.code === 'string' &&
        (ERROR_CODES as readonly string[]).includes(p.code);
      // DESIGN §6: a batch answers each item on its own, so a body whose only fault lies inside
      // its items (a duplicate key, nesting too deep) is 200 with a problem for every item.
      const items = res.status === 200 ? batchItems(text) : undefined;
      const ok =
        !text.includes(MARKER) &&
        (items !== undefined
          ? items.length > 0 && items.every(isProblem)
          : res.headers.get('content-type') === 'application/problem+json' &&
            isProblem({ status: res.status, code }));
      if (!ok) failures.push(`${c.route} / ${c.variant}: ${res.status} ${text.slice(0, 200)}`);
      for (const answer of items ?? [{ code }]) {
        codes.set(String(answer.code), (codes.get(String(answer.code)) ?? 0) + 1);
      }
    }
    expect(failures).toEqual([]);
    // Nothing reached the service, and the store holds exactly what it held.
    expect(h.calls).toEqual({});
    expect(await h.dump([ACME_PROD, ACME_DEV, GLOBEX_PROD])).toBe(before);
    expect([...codes.keys()].sort()).toEqual([
      'invalid_input',
      'payload_too_large',
      'unsupported_media_type',
    ]);
    // Some 900 requests through app.request(): ~2 s alone, past vitest's 5 s default on a loaded
    // 2-core machine (seen while other test files ran beside it).
  }, 30_000);

  it('answers batches whose items are all malformed item by item, without calling the service', async () => {
    const items = [
      { scope: ACME_PROD },
      [],
      `${MARKER}`,
      { owner: { scope: ACME_PROD }, sequence: MARKER },
      null,
    ];
    for (const path of [
      `${scopePath(ACME_PROD)}/tasks:batch`,
      '/v1/worker/acquire:batch',
      '/v1/worker/renew:batch',
      '/v1/worker/settle:batch',
    ]) {
      const res = await h.call(path, { key: KEYS.admin, json: { commands: items } });
      const text = await res.text();
      expect(res.status).toBe(200);
      expect(text).not.toContain(MARKER);
      const body = JSON.parse(text) as {
        results?: { code: string }[];
        replies?: { code: string }[];
      };
      const answers = body.results ?? body.replies ?? [];
      expect(answers.map((a) => a.code)).toEqual(items.map(() => 'invalid_input'));
    }
    expect(h.calls).toEqual({});
    expect(await h.dump([ACME_PROD, ACME_DEV, GLOBEX_PROD])).toBe(before);
  });
});
