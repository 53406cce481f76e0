/**
 * `/metrics` of a real server process on real PostgreSQL: HTTP durations by route pattern,
 * queue depth read from the database on scrape, acquire and settle outcomes, and lease expiries
 * counted by the maintenance loop.
 */
import type { AcquireReply, Assignment, WorkerSession } from '@ledgence/contracts';
import { createTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ServerProcess, startServerProcess } from './server-process.js';
import { metricSamples } from './test/wire.js';

const scope = { tenant_id: 'acme', namespace: 'metrics' };
const base = `/v1/tenants/${scope.tenant_id}/namespaces/${scope.namespace}`;

async function post<T>(url: string, path: string, body: unknown) {
  const response = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as T };
}

/** The samples of a scrape, keyed by `name{labels}` exactly as exposed. */
async function scrape(url: string): Promise<Map<string, number>> {
  const response = await fetch(`${url}/metrics`);
  expect(response.status).toBe(200);
  expect(response.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
  return metricSamples(await response.text());
}

/** Scrapes until `ready` holds (the maintenance loop runs on its own schedule). */
async function scrapeUntil(
  url: string,
  ready: (samples: Map<string, number>) => boolean,
  timeoutMs = 15_000,
): Promise<Map<string, number>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const samples = await scrape(url);
    if (ready(samples) || Date.now() > deadline) return samples;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

function submitBody(key: string, queue: string) {
  return {
    idempotency_key: key,
    input: { ...scope, queue, program: { name: 'noop' }, data: { key } },
  };
}

async function claim(url: string, queue: string): Promise<Assignment> {
  const { body: session } = await post<WorkerSession>(url, '/v1/worker/sessions', {
    scope,
    queue,
    concurrency: 1,
  });
  const { body } = await post<AcquireReply>(url, '/v1/worker/acquire', {
    scope,
    queue,
    worker_session_id: session.id,
    consumer_id: 0,
    sequence: 1,
  });
  if (body.disposition !== 'assigned') throw new Error(`expected an assignment in ${queue}`);
  return body.assignment;
}

const SUBMIT_ROUTE = '/v1/tenants/:tenant_id/namespaces/:namespace/tasks';

describe('/metrics of a server process', () => {
  let database: TestDatabase;
  let server: ServerProcess;

  beforeAll(async () => {
    database = await createTestDatabase({ prefix: 'metrics_e2e' });
    server = await startServerProcess({
      DATABASE_URL: database.url,
      // Short leases and a fast maintenance loop, so a lease expires within the test.
      LEDGENCE_LEASE_DURATION_MS: '1000',
      LEDGENCE_RENEW_INTERVAL_MS: '400',
      LEDGENCE_CLEANUP_GRACE_MS: '200',
      LEDGENCE_LEASE_SAFETY_MARGIN_MS: '100',
      LEDGENCE_MAINTENANCE_INTERVAL_MS: '200',
    });
  });
  afterAll(async () => {
    await server?.stop('SIGKILL');
    await database?.drop();
  });

  it('shows HTTP durations by route pattern and queue depth after a submit', async () => {
    for (const key of ['m-1', 'm-2', 'm-3']) {
      expect((await post(server.url, `${base}/tasks`, submitBody(key, 'depth'))).status).toBe(201);
    }
    const samples = await scrape(server.url);
    const submits = `ledgence_http_request_duration_seconds_count{route="${SUBMIT_ROUTE}",method="POST",status_class="2xx"}`;
    expect(samples.get(submits)).toBe(3);
    // The raw path (tenant, namespace) never becomes a label value.
    expect([...samples.keys()].some((key) => key.includes('/tenants/acme'))).toBe(false);
    expect(samples.get('ledgence_queue_depth{queue="depth",state="queued"}')).toBe(3);
    expect(samples.get('ledgence_queue_depth{queue="depth",state="active"}')).toBe(0);
    // Node's own metrics come along.
    expect(samples.has('process_resident_memory_bytes')).toBe(true);
  });

  it('counts acquires and settlements, and moves the depth from queued to active', async () => {
    await post(server.url, `${base}/tasks`, submitBody('s-1', 'settle'));
    const assignment = await claim(server.url, 'settle');
    const owner = assignment.lease.owner;
    let sequence = 0;
    const renew = (intent: 'dispatch' | 'keep_alive') =>
      post(server.url, '/v1/worker/renew', { owner, sequence: ++sequence, intent });
    expect((await renew('dispatch')).status).toBe(200);
    // A depth read answers the scrapes of the next second (metrics.ts sharedRead): scrape until
    // it shows the claim, renewing the 1 s lease meanwhile.
    const active = 'ledgence_queue_depth{queue="settle",state="active"}';
    let claimed = await scrape(server.url);
    for (let round = 0; claimed.get(active) !== 1 && round < 100; round += 1) {
      expect((await renew('keep_alive')).status).toBe(200);
      await new Promise((resolve) => setTimeout(resolve, 100));
      claimed = await scrape(server.url);
    }
    expect(claimed.get(active)).toBe(1);
    expect(claimed.get('ledgence_queue_depth{queue="settle",state="queued"}')).toBe(0);
    expect(
      claimed.get('ledgence_acquire_outcomes_total{disposition="assigned",code="none"}'),
    ).toBeGreaterThanOrEqual(1);

    const settle = {
      owner,
      operation_id: 'settle-1',
      report: {
        kind: 'completed',
        report: {
          context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
          outcome: { kind: 'success', output: null },
        },
      },
      quiescence: 'confirmed',
    };
    expect((await post(server.url, '/v1/worker/settle', settle)).status).toBe(200);
    expect((await post(server.url, '/v1/worker/settle', settle)).status).toBe(200);
    const settled = await scrapeUntil(
      server.url,
      (samples) => !samples.has('ledgence_queue_depth{queue="settle",state="active"}'),
    );
    const outcome = (name: string, code: string, state: string) =>
      settled.get(
        `ledgence_settle_outcomes_total{outcome="${name}",code="${code}",task_state="${state}"}`,
      );
    expect(outcome('accepted', 'none', 'succeeded')).toBe(1);
    expect(outcome('replayed', 'none', 'succeeded')).toBe(1);
    // Drained: the queue has no tasks left, so it is no longer a label value.
    expect(settled.has('ledgence_queue_depth{queue="settle",state="active"}')).toBe(false);
  });

  it('counts a lease the maintenance loop recovers', async () => {
    await post(server.url, `${base}/tasks`, submitBody('e-1', 'expiry'));
    await claim(server.url, 'expiry'); // never renewed: the lease runs out
    const expiries = (samples: Map<string, number>) =>
      ['requeued', 'failed', 'cancelled']
        .map((o) => samples.get(`ledgence_lease_expiries_total{outcome="${o}"}`) ?? 0)
        .reduce((a, b) => a + b, 0);
    const samples = await scrapeUntil(server.url, (s) => expiries(s) >= 1);
    expect(expiries(samples)).toBe(1);
  });
});
