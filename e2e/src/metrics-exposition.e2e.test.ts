/**
 * `/metrics` of a real server process as a Prometheus server and an operator read
 * it — text format 0.0.4 checked strictly (HELP/TYPE once per family and before its samples, one
 * contiguous group per family, escaped label values that unescape to the real queue names,
 * cumulative histograms ending in +Inf with _count equal to it), counters that never go down,
 * label sets that stay bounded whatever clients send, and the README's metrics moving on their
 * documented events (a cleanup finalized at the authority deadline).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Stack, until } from './test/harness.js';
import { call, claimNext, submitTask, TASKS_BASE, taskBody } from './test/wire.js';

interface Sample {
  name: string;
  labels: Map<string, string>;
  value: number;
  line: number;
}

interface Exposition {
  samples: Sample[];
  types: Map<string, string>;
  text: string;
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

/** Parses one label set `{a="x",b="y"}` strictly (0.0.4 escapes: \\ \" \n only). */
function parseLabels(text: string, at: number, line: number): [Map<string, string>, number] {
  const labels = new Map<string, string>();
  let i = at + 1; // past '{'
  for (;;) {
    if (text[i] === '}') return [labels, i + 1];
    const eq = text.indexOf('=', i);
    if (eq < 0) throw new Error(`line ${line}: no '=' in label set`);
    const name = text.slice(i, eq);
    if (!LABEL.test(name)) throw new Error(`line ${line}: bad label name ${JSON.stringify(name)}`);
    if (labels.has(name)) throw new Error(`line ${line}: label ${name} twice`);
    if (text[eq + 1] !== '"') throw new Error(`line ${line}: label value not quoted`);
    let value = '';
    let j = eq + 2;
    for (;;) {
      const c = text[j];
      if (c === undefined) throw new Error(`line ${line}: unterminated label value`);
      if (c === '"') break;
      if (c === '\\') {
        const n = text[j + 1];
        if (n === '\\') value += '\\';
        else if (n === '"') value += '"';
        else if (n === 'n') value += '\n';
        else throw new Error(`line ${line}: bad escape \\${n}`);
        j += 2;
        continue;
      }
      value += c;
      j += 1;
    }
    labels.set(name, value);
    i = j + 1;
    if (text[i] === ',') i += 1;
    else if (text[i] !== '}') throw new Error(`line ${line}: expected ',' or '}' at ${i}`);
  }
}

/** The family a sample belongs to, given the declared types. */
function familyOf(name: string, types: Map<string, string>): string {
  if (types.has(name)) return name;
  for (const suffix of ['_bucket', '_sum', '_count']) {
    const base = name.endsWith(suffix) ? name.slice(0, -suffix.length) : undefined;
    if (base !== undefined && (types.get(base) === 'histogram' || types.get(base) === 'summary')) {
      return base;
    }
  }
  return name;
}

/** Parses a whole exposition strictly; throws on anything Prometheus 0.0.4 would refuse. */
function parseExposition(text: string): Exposition {
  const types = new Map<string, string>();
  const helps = new Set<string>();
  const samples: Sample[] = [];
  const seenSeries = new Set<string>();
  const closedFamilies = new Set<string>();
  let currentFamily: string | undefined;
  const lines = text.split('\n');
  if (text.length > 0 && !text.endsWith('\n')) throw new Error('exposition does not end in \\n');
  lines.forEach((raw, index) => {
    const line = index + 1;
    if (raw === '') return;
    if (raw.startsWith('#')) {
      const m = /^# (HELP|TYPE) (\S+) ?(.*)$/.exec(raw);
      if (m === null) return; // a plain comment
      const [, kind, name, rest] = m as unknown as [string, string, string, string];
      if (!NAME.test(name)) throw new Error(`line ${line}: bad metric name ${name}`);
      if (kind === 'HELP') {
        if (helps.has(name)) throw new Error(`line ${line}: HELP of ${name} twice`);
        helps.add(name);
        if (/\\[^\\n]/.test(rest.replace(/\\\\/g, ''))) {
          throw new Error(`line ${line}: bad escape in HELP of ${name}`);
        }
      } else {
        if (types.has(name)) throw new Error(`line ${line}: TYPE of ${name} twice`);
        if (!['counter', 'gauge', 'histogram', 'summary', 'untyped'].includes(rest)) {
          throw new Error(`line ${line}: bad TYPE ${rest}`);
        }
        if (closedFamilies.has(name) || samples.some((s) => familyOf(s.name, types) === name)) {
          throw new Error(`line ${line}: TYPE of ${name} after its samples`);
        }
        types.set(name, rest);
      }
      return;
    }
    const nameEnd = raw.search(/[{ ]/);
    if (nameEnd <= 0) throw new Error(`line ${line}: no metric name: ${raw}`);
    const name = raw.slice(0, nameEnd);
    if (!NAME.test(name)) throw new Error(`line ${line}: bad metric name ${name}`);
    let labels = new Map<string, string>();
    let rest = nameEnd;
    if (raw[nameEnd] === '{') [labels, rest] = parseLabels(raw, nameEnd, line);
    const tail = raw.slice(rest);
    const vm = /^ (\S+)( -?\d+)?$/.exec(tail);
    if (vm === null) throw new Error(`line ${line}: bad value part ${JSON.stringify(tail)}`);
    const text = vm[1] as string;
    // Go's ParseFloat (what Prometheus uses for 0.0.4) takes NaN/Inf in any case: prom-client
    // writes `Nan`.
    const special = text.toLowerCase();
    const value =
      special === '+inf' || special === 'inf'
        ? Infinity
        : special === '-inf'
          ? -Infinity
          : special === 'nan'
            ? NaN
            : Number(text);
    if (Number.isNaN(value) && special !== 'nan')
      throw new Error(`line ${line}: bad value ${text}`);
    const family = familyOf(name, types);
    if (family !== currentFamily) {
      if (currentFamily !== undefined) closedFamilies.add(currentFamily);
      if (closedFamilies.has(family)) {
        throw new Error(`line ${line}: samples of ${family} not in one group`);
      }
      currentFamily = family;
    }
    const key = `${name}{${[...labels].map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(',')}}`;
    if (seenSeries.has(key)) throw new Error(`line ${line}: series ${key} twice`);
    seenSeries.add(key);
    samples.push({ name, labels, value, line });
  });
  return { samples, types, text };
}

/** Checks every histogram series: ascending le, cumulative, ending in +Inf = _count. */
function checkHistograms(exposition: Exposition): string[] {
  const problems: string[] = [];
  for (const [family, type] of exposition.types) {
    if (type !== 'histogram') continue;
    const groups = new Map<string, { le: number; value: number }[]>();
    const counts = new Map<string, number>();
    const sums = new Set<string>();
    const keyOf = (labels: Map<string, string>) =>
      JSON.stringify([...labels].filter(([k]) => k !== 'le').sort());
    for (const s of exposition.samples) {
      if (s.name === `${family}_bucket`) {
        const le = s.labels.get('le');
        if (le === undefined) problems.push(`${family}: bucket without le (line ${s.line})`);
        const list = groups.get(keyOf(s.labels)) ?? [];
        list.push({ le: le === '+Inf' ? Infinity : Number(le), value: s.value });
        groups.set(keyOf(s.labels), list);
      } else if (s.name === `${family}_count`) counts.set(keyOf(s.labels), s.value);
      else if (s.name === `${family}_sum`) sums.add(keyOf(s.labels));
    }
    for (const [key, buckets] of groups) {
      for (let i = 1; i < buckets.length; i += 1) {
        const a = buckets[i - 1] as { le: number; value: number };
        const b = buckets[i] as { le: number; value: number };
        if (!(b.le > a.le)) problems.push(`${family}${key}: le not ascending`);
        if (b.value < a.value) problems.push(`${family}${key}: buckets not cumulative`);
      }
      const last = buckets.at(-1);
      if (last?.le !== Infinity) problems.push(`${family}${key}: last bucket is not +Inf`);
      if (counts.get(key) !== last?.value) {
        problems.push(`${family}${key}: _count ${counts.get(key)} != +Inf ${last?.value}`);
      }
      if (!sums.has(key)) problems.push(`${family}${key}: no _sum`);
    }
    for (const key of counts.keys()) {
      if (!groups.has(key)) problems.push(`${family}${key}: _count without buckets`);
    }
  }
  return problems;
}

async function scrape(url: string): Promise<Exposition> {
  const response = await fetch(`${url}/metrics`);
  expect(response.status).toBe(200);
  expect(response.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
  return parseExposition(await response.text());
}

function seriesKey(s: Sample): string {
  return `${s.name}${JSON.stringify([...s.labels].sort())}`;
}

/** Every counter and histogram series of `before` that went down (or vanished) in `after`. */
function decreased(before: Exposition, after: Exposition): string[] {
  const now = new Map(after.samples.map((s) => [seriesKey(s), s.value]));
  const out: string[] = [];
  for (const s of before.samples) {
    const type = before.types.get(familyOf(s.name, before.types));
    if (type !== 'counter' && type !== 'histogram') continue;
    const later = now.get(seriesKey(s));
    if (later === undefined || later < s.value) out.push(`${seriesKey(s)}: ${s.value} → ${later}`);
  }
  return out;
}

const stack = new Stack('metrics_exposition');
let url: string;

beforeAll(async () => {
  await stack.open();
  url = (
    await stack.start({
      LEDGENCE_LEASE_DURATION_MS: '1000',
      LEDGENCE_CLEANUP_GRACE_MS: '300',
      LEDGENCE_LEASE_SAFETY_MARGIN_MS: '100',
      LEDGENCE_RENEW_INTERVAL_MS: '300',
    })
  ).url;
});
afterAll(() => stack.close());

/** Queue names a client may use whose label values need escaping or are not ASCII. */
const TRICKY = ['q"quote', 'q\\back\\slash', 'qüñï—名前', 'q{a="b"},c=d', 'q\\"mixed\\n'];

describe('/metrics is valid Prometheus text 0.0.4 on a real server', () => {
  it('parses strictly after a workload with queue names holding quotes, backslashes and non-ASCII, and the label values unescape to those names', async () => {
    for (const [i, queue] of TRICKY.entries()) {
      await submitTask(url, taskBody(`tricky-${i}`, queue));
    }
    // Some traffic for the other families: a claim, a settle, a long poll, errors.
    await submitTask(url, taskBody('done-1', 'plain'));
    const assignment = await claimNext(url, 'plain');
    await call(url, '/v1/worker/settle', {
      owner: assignment.lease.owner,
      operation_id: 'op-1',
      report: {
        kind: 'completed',
        report: {
          context: {
            identity: {
              task_id: assignment.lease.owner.task_id,
              attempt_id: assignment.lease.owner.attempt_id,
            },
          },
          outcome: { kind: 'success', output: null },
        },
      },
      quiescence: 'confirmed',
    });
    await call(url, `${TASKS_BASE}/tasks/tsk_nope`);
    await call(url, '/nowhere');

    const exposition = await until(
      async () => {
        const e = await scrape(url);
        return TRICKY.every((q) =>
          e.samples.some((s) => s.name === 'ledgence_queue_depth' && s.labels.get('queue') === q),
        );
      },
      15_000,
      'tricky queues in the depth gauge',
    ).then(() => scrape(url));
    expect(checkHistograms(exposition)).toEqual([]);
    for (const queue of TRICKY) {
      const queued = exposition.samples.find(
        (s) =>
          s.name === 'ledgence_queue_depth' &&
          s.labels.get('queue') === queue &&
          s.labels.get('state') === 'queued',
      );
      expect(queued?.value, queue).toBe(1);
    }
    // Every family the README documents is declared with its type.
    expect(
      Object.fromEntries([...exposition.types].filter(([n]) => n.startsWith('ledgence_'))),
    ).toEqual({
      ledgence_http_request_duration_seconds: 'histogram',
      ledgence_acquire_outcomes_total: 'counter',
      ledgence_acquire_wait_seconds: 'histogram',
      ledgence_settle_outcomes_total: 'counter',
      ledgence_lease_expiries_total: 'counter',
      ledgence_lease_cleanup_finalized_total: 'counter',
      ledgence_queue_depth: 'gauge',
      ledgence_queue_depth_errors_total: 'counter',
      ledgence_callback_deliveries_total: 'counter',
      ledgence_callback_delivery_duration_seconds: 'histogram',
      ledgence_callback_due_backlog: 'gauge',
      ledgence_callback_backlog_errors_total: 'counter',
      ledgence_retention_removed_total: 'counter',
      ledgence_retention_transactions_total: 'counter',
      ledgence_retention_rounds_total: 'counter',
    });
  });

  it('keeps every label set bounded: many queue names, task ids in paths, unknown routes and odd methods add no series per value', async () => {
    const before = await scrape(url);
    const httpSeries = (e: Exposition) =>
      e.samples.filter((s) => s.name === 'ledgence_http_request_duration_seconds_count').length;
    // 80 queues with one task each, and one deeper queue that must stay named.
    for (let i = 0; i < 80; i += 1) await submitTask(url, taskBody(`many-${i}`, `many-${i}`));
    for (let i = 0; i < 3; i += 1) await submitTask(url, taskBody(`deep-${i}`, 'deep'));
    // Task ids, unknown paths, query strings and methods a client controls.
    const junk: Promise<unknown>[] = [];
    for (let i = 0; i < 150; i += 1) {
      junk.push(call(url, `${TASKS_BASE}/tasks/tsk_${i.toString(16).padStart(32, '0')}`));
      junk.push(call(url, `/probe/${i}/x?y=${i}`));
      junk.push(
        fetch(`${url}${TASKS_BASE}/tasks/t${i}`, { method: 'DELETE' }).then((r) => r.text()),
      );
      junk.push(fetch(`${url}/metrics?n=${i}`).then((r) => r.text()));
      if (junk.length >= 40) await Promise.all(junk.splice(0));
    }
    await Promise.all(junk);
    for (const method of ['PATCH', 'OPTIONS', 'HEAD', 'PUT']) {
      await fetch(`${url}/v1/worker/acquire`, { method }).then((r) => r.arrayBuffer());
    }

    const after = await until(
      async () => {
        const e = await scrape(url);
        return e.samples.some(
          (s) => s.name === 'ledgence_queue_depth' && s.labels.get('queue') === 'deep',
        );
      },
      15_000,
      'the deep queue in the depth gauge',
    ).then(() => scrape(url));
    // The HTTP histogram: a few new (route, method, status class) combinations at most.
    expect(httpSeries(after) - httpSeries(before)).toBeLessThanOrEqual(12);
    const routes = new Set(
      after.samples
        .filter((s) => s.name === 'ledgence_http_request_duration_seconds_count')
        .map((s) => s.labels.get('route')),
    );
    expect(
      [...routes].filter(
        (r) =>
          r !== 'unmatched' &&
          !r?.includes(':') &&
          !/^\/(metrics|healthz|readyz|openapi\.json)$/.test(r ?? '') &&
          !r?.startsWith('/v1/worker/'),
      ),
    ).toEqual([]);
    // The queue label: at most 50 queues of their own plus _other, the deep one kept, all summed.
    const depth = after.samples.filter((s) => s.name === 'ledgence_queue_depth');
    const queues = new Set(depth.map((s) => s.labels.get('queue')));
    expect(queues.size).toBeLessThanOrEqual(51);
    expect(queues.has('deep')).toBe(true);
    expect(queues.has('_other')).toBe(true);
    const queuedTotal = depth
      .filter((s) => s.labels.get('state') === 'queued')
      .reduce((a, s) => a + s.value, 0);
    expect(queuedTotal).toBe(TRICKY.length + 80 + 3);
    expect(after.text.length).toBeLessThan(256 * 1024);
    expect(checkHistograms(after)).toEqual([]);
    expect(decreased(before, after)).toEqual([]);
  });

  it('counts a settled attempt whose cleanup was never confirmed in ledgence_lease_cleanup_finalized_total when its lease runs out, and never lowers a counter meanwhile', async () => {
    const before = await scrape(url);
    const finalized = (e: Exposition) =>
      e.samples.find((s) => s.name === 'ledgence_lease_cleanup_finalized_total')?.value ?? -1;
    const expiries = (e: Exposition) =>
      e.samples
        .filter((s) => s.name === 'ledgence_lease_expiries_total')
        .reduce((a, s) => a + s.value, 0);
    const taskId = await submitTask(
      url,
      taskBody('unconfirmed-1', 'cleanup', { timeout_ms: 2_000 }),
    );
    const assignment = await claimNext(url, 'cleanup');
    const owner = assignment.lease.owner;
    const settled = await call<{ task_state?: string }>(url, '/v1/worker/settle', {
      owner,
      operation_id: 'op-unconfirmed',
      report: {
        kind: 'completed',
        report: {
          context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
          outcome: { kind: 'success', output: { ok: true } },
        },
      },
      quiescence: 'unconfirmed',
    });
    expect(settled.status).toBe(200);
    // No quiescence confirmation and no renewal: the authority deadline passes.
    let last = before;
    await until(
      async () => {
        const e = await scrape(url);
        expect(decreased(last, e)).toEqual([]);
        last = e;
        return finalized(e) >= finalized(before) + 1;
      },
      30_000,
      'the finalized cleanup counted',
    );
    expect(finalized(last)).toBe(finalized(before) + 1);
    // Finalizing a held settlement is not a lease expiry of a running attempt.
    expect(expiries(last)).toBe(expiries(before));
    const status = await call<{ state: string }>(url, `${TASKS_BASE}/tasks/${taskId}`);
    expect(status.body.state).toBe('succeeded');
  });
});
