/**
 * DESIGN §6 batch-route rules over the real server on PostgreSQL, for `{scope}/tasks:batch`:
 * each item is validated and answered on its own (an item's error does not fail its
 * neighbours), items share one transaction only where that cannot change any item's outcome,
 * and replies keep request order. The items here fail at every stage — decoding, the adapter's
 * scope check, the service's rules (timeout within the safety margin, `available_at` too far
 * ahead, read against store time inside the store's transaction) and idempotency — between
 * valid neighbours, which must all be stored.
 */
import {
  MAX_SUBMIT_DELAY_MS,
  type Problem,
  type Scope,
  type TaskPage,
  type TaskSnapshot,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { keyedServer } from './testdata/keyed-server.js';

const KEY = 'br-acme-star-key-000000001';
const A: Scope = { tenant_id: 'acme', namespace: 'a' };
const SCOPE = `/v1/tenants/${A.tenant_id}/namespaces/${A.namespace}`;

const server = keyedServer('batch_rules', {
  LEDGENCE_API_KEYS: JSON.stringify([
    { key: KEY, tenant: 'acme', namespaces: ['*'], roles: ['client', 'worker'] },
  ]),
});

const command = (key: string, input: Record<string, unknown> = {}) => ({
  idempotency_key: key,
  input: { ...A, queue: 'br', program: { name: 'p' }, data: { key }, ...input },
});

describe('DESIGN §6 tasks:batch', () => {
  it('answers items failing at every stage in request order, and stores exactly the valid ones', async () => {
    const taken = await server.call(KEY, 'POST', `${SCOPE}/tasks`, command('br-taken'));
    expect(taken.status).toBe(201);
    const commands = [
      command('br-0'),
      { idempotency_key: 'br-1' },
      command('br-2', { namespace: 'b' }),
      command('br-taken', { data: 'another command' }),
      command('br-4', { timeout_ms: 1_000 }),
      command('br-5', { available_at: Date.now() + MAX_SUBMIT_DELAY_MS + 3_600_000 }),
      command('br-6', { priority: 7 }),
      command('br-0'),
      command('br-6', { priority: 8 }),
      command('br-taken'),
    ];
    const reply = await server.call<{ results: (TaskSnapshot | Problem)[] }>(
      KEY,
      'POST',
      `${SCOPE}/tasks:batch`,
      { commands },
    );
    expect(reply.status).toBe(200);
    const { results } = reply.body;
    const view = results.map((r) =>
      'code' in r ? [r.status, r.code, r.path] : [r.idempotency_key, r.state],
    );
    expect(view).toEqual([
      ['br-0', 'queued'],
      [400, 'invalid_input', '$.commands[1].input'],
      [400, 'invalid_input', '$.commands[2].input.namespace'],
      [409, 'conflict', undefined],
      [400, 'invalid_input', '$.commands[4].input.timeout_ms'],
      [400, 'invalid_input', '$.commands[5].input.available_at'],
      ['br-6', 'queued'],
      ['br-0', 'queued'],
      [409, 'conflict', undefined],
      ['br-taken', 'queued'],
    ]);
    const ids = results.map((r) => ('task_id' in r ? r.task_id : undefined));
    expect(ids[7]).toBe(ids[0]);
    expect(ids[9]).toBe(taken.body.task_id);
    const page = await server.call<TaskPage>(KEY, 'GET', `${SCOPE}/tasks?queue=br&limit=500`);
    expect(page.body.tasks.map((t) => t.task_id).sort()).toEqual(
      [ids[0], ids[6], taken.body.task_id].sort(),
    );
  });
});
