/**
 * The admin retention routes: the namespace's policy (default, set, read
 * back), its bounds checked at the edge, and the bounded preview with its
 * `limit` edges.
 */
import {
  CONTROL_REQUEST_MAX_BYTES,
  MAX_RETENTION_BATCH,
  MAX_RETENTION_MS,
  MIN_RETENTION_MS,
  type RetentionPolicy,
  RetentionPolicySchema,
  type RetentionPreview,
  RetentionPreviewSchema,
  TERMINAL_RETENTION_MS,
} from '@ledgence/contracts';
import * as v from 'valibot';
import { describe, expect, it, vi } from 'vitest';
import { expectJson, expectProblem } from './testdata/expect.js';
import {
  ACME_DEV,
  ACME_PROD,
  createHarness,
  GLOBEX_PROD,
  type Harness,
  KEYS,
  policyPath,
  scopePath,
  submitTask,
} from './testdata/harness.js';

const POLICY = policyPath(ACME_PROD);
const PREVIEW = `${POLICY}/preview`;

async function readPolicy(h: Harness, path = POLICY): Promise<RetentionPolicy> {
  const policy = await expectJson<RetentionPolicy>(await h.call(path, { key: KEYS.admin }), 200);
  expect(v.safeParse(RetentionPolicySchema, policy).success).toBe(true);
  return policy;
}

function setPolicy(h: Harness, json: unknown, key: string = KEYS.admin) {
  return h.call(POLICY, { method: 'PUT', key, json });
}

async function preview(h: Harness, query = ''): Promise<RetentionPreview> {
  const res = await h.call(`${PREVIEW}${query}`, { key: KEYS.admin });
  const body = await expectJson<RetentionPreview>(res, 200);
  expect(v.safeParse(RetentionPreviewSchema, body).success).toBe(true);
  return body;
}

/** `count` terminal (cancelled) tasks in ACME_PROD, made over HTTP. */
async function terminalTasks(h: Harness, count: number): Promise<void> {
  for (let i = 0; i < count; i++) {
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    const res = await h.call(`${scopePath(ACME_PROD)}/tasks/${task.task_id}/cancel`, {
      method: 'POST',
      key: KEYS.client,
    });
    expect(res.status).toBe(200);
  }
}

describe('{scope}/retention-policy', () => {
  it('answers the default, then the policy set for the namespace', async () => {
    const h = createHarness();
    expect(await readPolicy(h)).toEqual({ retention_ms: TERMINAL_RETENTION_MS, source: 'default' });
    const set = await expectJson<RetentionPolicy>(
      await setPolicy(h, { retention_ms: 2 * MIN_RETENTION_MS }),
      200,
    );
    expect(set).toEqual({
      retention_ms: 2 * MIN_RETENTION_MS,
      source: 'namespace',
      updated_at: expect.any(Number),
    });
    expect(await readPolicy(h)).toEqual(set);
    // Another namespace keeps the default.
    expect((await readPolicy(h, policyPath(ACME_DEV))).source).toBe('default');
    // Setting it again replaces it.
    await expectJson(await setPolicy(h, { retention_ms: MIN_RETENTION_MS }), 200);
    expect((await readPolicy(h)).retention_ms).toBe(MIN_RETENTION_MS);
  });

  it.each([
    ['MIN_RETENTION_MS', MIN_RETENTION_MS, 200],
    ['MAX_RETENTION_MS', MAX_RETENTION_MS, 200],
    ['MIN_RETENTION_MS - 1', MIN_RETENTION_MS - 1, 400],
    ['MAX_RETENTION_MS + 1', MAX_RETENTION_MS + 1, 400],
    ['0', 0, 400],
    ['a fraction', MIN_RETENTION_MS + 0.5, 400],
    ['a negative number', -MIN_RETENTION_MS, 400],
  ])('checks retention_ms = %s at the edge', async (_name, retentionMs, status) => {
    const h = createHarness();
    const res = await setPolicy(h, { retention_ms: retentionMs });
    if (status === 200) {
      expect((await expectJson<RetentionPolicy>(res, 200)).retention_ms).toBe(retentionMs);
    } else {
      const problem = await expectProblem(res, 'invalid_input');
      expect(problem.path).toBe('$.retention_ms');
      // Rejected by the decoder: the store was never asked, and nothing changed.
      expect(h.calls['retention.setRetentionPolicy']).toBeUndefined();
      expect((await readPolicy(h)).source).toBe('default');
    }
  });

  it('rejects bad bodies, content types, sizes and queries before the store', async () => {
    const h = createHarness();
    for (const json of [{}, { retention_ms: '3600000' }, { retention_ms: null }, [], 1]) {
      await expectProblem(await setPolicy(h, json), 'invalid_input');
    }
    await expectProblem(
      await setPolicy(h, { retention_ms: MIN_RETENTION_MS, source: 'namespace' }),
      'invalid_input',
    );
    await expectProblem(await h.call(POLICY, { method: 'PUT', key: KEYS.admin }), 'invalid_input');
    const text = JSON.stringify({ retention_ms: MIN_RETENTION_MS });
    await expectProblem(
      await h.call(POLICY, {
        method: 'PUT',
        key: KEYS.admin,
        body: text,
        headers: { 'content-type': 'text/plain' },
      }),
      'unsupported_media_type',
    );
    await expectProblem(
      await h.call(POLICY, {
        method: 'PUT',
        key: KEYS.admin,
        body: text + ' '.repeat(CONTROL_REQUEST_MAX_BYTES + 1 - text.length),
        headers: { 'content-type': 'application/json' },
      }),
      'payload_too_large',
    );
    await expectProblem(
      await h.call(`${POLICY}?x=1`, {
        method: 'PUT',
        key: KEYS.admin,
        json: { retention_ms: MIN_RETENTION_MS },
      }),
      'invalid_input',
    );
    await expectProblem(await h.call(`${POLICY}?x=1`, { key: KEYS.admin }), 'invalid_input');
    expect(h.calls['retention.setRetentionPolicy']).toBeUndefined();
    expect(h.calls['retention.retentionPolicy']).toBeUndefined();
  });

  it('answers 403 to every key but an admin key bound to the scope', async () => {
    const h = createHarness();
    const body = { retention_ms: MIN_RETENTION_MS };
    for (const key of [KEYS.client, KEYS.worker, KEYS.both, KEYS.prodClient, KEYS.other]) {
      for (const [path, init] of [
        [POLICY, {}],
        [POLICY, { method: 'PUT', json: body }],
        [PREVIEW, {}],
      ] as const) {
        const problem = await expectProblem(await h.call(path, { key, ...init }), 'forbidden');
        expect(problem.reason).toBe('role');
      }
    }
    // The admin key of acme has no business in globex.
    for (const path of [policyPath(GLOBEX_PROD), `${policyPath(GLOBEX_PROD)}/preview`]) {
      const problem = await expectProblem(await h.call(path, { key: KEYS.admin }), 'forbidden');
      expect(problem.reason).toBe('scope');
    }
    await expectProblem(await h.call(POLICY, {}), 'unauthorized');
    expect(Object.keys(h.calls).filter((name) => name.startsWith('retention.'))).toEqual([]);
    expect((await readPolicy(h)).source).toBe('default');
  });
});

describe('GET {scope}/retention-policy/preview', () => {
  it('counts the terminal tasks older than the cutoff, bounded by limit', async () => {
    const h = createHarness();
    await expectJson(await setPolicy(h, { retention_ms: MIN_RETENTION_MS }), 200);
    const empty = await preview(h);
    expect(empty).toEqual({
      retention_ms: MIN_RETENTION_MS,
      as_of: expect.any(Number),
      cutoff: empty.as_of - MIN_RETENTION_MS,
      candidates: 0,
      truncated: false,
    });
    await terminalTasks(h, 3);
    // A queued task is never a candidate, however old.
    await submitTask(h, ACME_PROD, KEYS.client);
    expect((await preview(h)).candidates).toBe(0);
    h.store.advance(MIN_RETENTION_MS + 1);
    const all = await preview(h);
    expect(all).toMatchObject({ candidates: 3, truncated: false });
    expect(all.oldest_terminal_at).toBeLessThan(all.cutoff);
    expect(await preview(h, '?limit=2')).toMatchObject({ candidates: 2, truncated: true });
    expect(await preview(h, '?limit=3')).toMatchObject({ candidates: 3, truncated: false });
  });

  it.each([
    ['1', 200],
    [String(MAX_RETENTION_BATCH), 200],
    ['0', 400],
    [String(MAX_RETENTION_BATCH + 1), 400],
    ['1.5', 400],
    ['-1', 400],
    ['1e3', 400],
    ['abc', 400],
    ['', 400],
    ['99999999999999999999', 400],
  ])('takes limit=%s with %i', async (limit, status) => {
    const h = createHarness();
    const res = await h.call(`${PREVIEW}?limit=${limit}`, { key: KEYS.admin });
    if (status === 200) {
      await expectJson(res, 200);
      expect(h.calls['retention.previewRetention']).toBe(1);
    } else {
      expect((await expectProblem(res, 'invalid_input')).path).toBe('query.limit');
      expect(h.calls['retention.previewRetention']).toBeUndefined();
    }
  });

  it('defaults limit to MAX_RETENTION_BATCH and rejects repeated or unknown parameters', async () => {
    const h = createHarness();
    const spy = vi.spyOn(h.store, 'previewRetention');
    await preview(h);
    expect(spy).toHaveBeenCalledExactlyOnceWith(ACME_PROD, MAX_RETENTION_BATCH);
    await expectProblem(
      await h.call(`${PREVIEW}?limit=1&limit=2`, { key: KEYS.admin }),
      'invalid_input',
    );
    await expectProblem(await h.call(`${PREVIEW}?cursor=x`, { key: KEYS.admin }), 'invalid_input');
  });
});

describe('without retention operations', () => {
  it('does not mount the retention routes', async () => {
    const h = createHarness({ retention: undefined });
    for (const path of [POLICY, PREVIEW]) {
      await expectProblem(await h.call(path, { key: KEYS.admin }), 'not_found');
    }
    await expectProblem(
      await h.call(POLICY, {
        method: 'PUT',
        key: KEYS.admin,
        json: { retention_ms: MIN_RETENTION_MS },
      }),
      'not_found',
    );
  });
});
