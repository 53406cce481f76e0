/**
 * The SDK's `Client.list` against the real server process, by labels, page after page: labels
 * whose keys and values hold the characters a query string gives meaning to; labels, names and
 * a namespace at the largest sizes DESIGN §4/§12 allow (a cursor of DESIGN §4 comes on top from
 * page 2); a labels object the caller changes while it walks; and filters spelled null.
 */
import { LABEL_KEY_MAX_BYTES, LABEL_VALUE_MAX_BYTES, MAX_LABELS } from '@ledgence/contracts';
import { Client, silentLogger } from '@ledgence/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { client, Stack, TENANT } from './test/harness.js';

const stack = new Stack('client_list_labels');
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  server = await stack.start();
});
afterAll(async () => {
  await stack.close();
});

/** Every task id `c.list(filters)` walks to, page after page. */
async function walk(c: Client, filters: Parameters<Client['list']>[0]): Promise<string[]> {
  const listed: string[] = [];
  for await (const page of c.list(filters)) listed.push(...page.tasks.map((task) => task.task_id));
  return listed;
}

/**
 * `bytes` UTF-8 bytes of text: `prefix`, then `/` (path-like label values and keys such as
 * `app.example.com/team` are common; a query string escapes `/`, as it escapes any non-ASCII
 * byte, to three characters).
 */
function text(prefix: string, bytes: number): string {
  return prefix + '/'.repeat(bytes - Buffer.byteLength(prefix));
}

describe('Client.list', () => {
  it('matches labels with `=`, `&`, `+`, `%`, spaces and non-ASCII text, page after page', async () => {
    const c = client(server.url);
    const labels = { 'a=b&c': 'x y+z%', 'é.ü': '☃ %E9 \ufffd', '100%': 'a&b=c' };
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      ids.push((await c.submit({ queue: 'q-list-labels', program: 'p', data: i, labels })).task_id);
    }
    // A task missing one of the labels, and one with a near miss, are not listed.
    await c.submit({
      queue: 'q-list-labels',
      program: 'p',
      data: 0,
      labels: { 'a=b&c': 'x y+z%' },
    });
    await c.submit({
      queue: 'q-list-labels',
      program: 'p',
      data: 0,
      labels: { ...labels, 'a=b&c': 'x y z%' },
    });
    expect((await walk(c, { labels, limit: 2 })).sort()).toEqual([...ids].sort());
  });

  it('lists by a task’s own labels at their largest legal size, page after page (no 413 header_too_large)', async () => {
    // A namespace name at its largest (128 bytes), as DESIGN §4 allows.
    const namespace = `list-${'n'.repeat(123)}`;
    const c = new Client({ url: server.url, tenant: TENANT, namespace, logger: silentLogger });
    const labels: Record<string, string> = {};
    for (let i = 0; i < MAX_LABELS; i++) {
      labels[text(`k${String(i).padStart(2, '0')}`, LABEL_KEY_MAX_BYTES)] = text(
        `v${i}`,
        LABEL_VALUE_MAX_BYTES,
      );
    }
    const queue = text('q', 128);
    const program = text('p', 128);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      // Accepted: every field is within its limit.
      ids.push((await c.submit({ queue, program, data: i, labels })).task_id);
    }
    const outcome = await walk(c, { queue, program, labels, limit: 1 }).catch(
      (error: { status?: number; code?: string; reason?: string }) => [
        error.status,
        error.code,
        error.reason,
      ],
    );
    expect(outcome).toEqual([...ids].reverse());
  });

  it('walks with the filters it started with when the caller changes its labels object meanwhile', async () => {
    const c = client(server.url);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const labels = { team: 'walk-a' };
      ids.push((await c.submit({ queue: 'q-list-walk', program: 'p', data: i, labels })).task_id);
    }
    const labels: Record<string, string> = { team: 'walk-a' };
    const listed: string[] = [];
    for await (const page of c.list({ labels, limit: 1 })) {
      listed.push(...page.tasks.map((task) => task.task_id));
      labels.team = 'walk-b'; // the caller's object, reused for something else
      labels.extra = 'x';
    }
    expect(listed).toEqual([...ids].reverse());
  });

  it('takes a filter spelled null for no filter, as the server does (DESIGN §4.1), not a queue named "null"', async () => {
    const c = client(server.url);
    const labels = { run: 'null-filter' };
    const id = (await c.submit({ queue: 'q-list-null', program: 'p', labels })).task_id;
    // Untyped callers can send null (`process.env.QUEUE ?? null`); TaskFilters types forbid it.
    const filters = { labels, queue: null, program: null } as unknown as Parameters<
      Client['list']
    >[0];
    expect(await walk(c, filters)).toEqual([id]);
  });
});
