/**
 * `Client.list` with filters at the sizes DESIGN §4/§12 allow (≤ 16 label pairs,
 * keys ≤ 64 bytes, values ≤ 255 bytes; queue and program names ≤ 128 bytes; scope names ≤ 128
 * bytes), against the real server process over real sockets. A task may carry such labels, so
 * listing by them must work, on every page (a cursor of DESIGN §4 comes on top from page 2).
 */
import { LABEL_KEY_MAX_BYTES, LABEL_VALUE_MAX_BYTES, MAX_LABELS } from '@ledgence/contracts';
import { Client, silentLogger } from '@ledgence/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { Stack, TENANT } from './test/harness.js';

const stack = new Stack('client_list_limits');
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  server = await stack.start();
});
afterAll(async () => {
  await stack.close();
});

/**
 * `bytes` UTF-8 bytes of text: `prefix`, then `/` (path-like label values and keys such as
 * `app.example.com/team` are common; a query string escapes `/`, as it escapes any non-ASCII
 * byte, to three characters).
 */
function text(prefix: string, bytes: number): string {
  return prefix + '/'.repeat(bytes - Buffer.byteLength(prefix));
}

describe('Client.list by a task’s own labels at their largest legal size', () => {
  it('lists every matching task, page after page, instead of 413 header_too_large', async () => {
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
    const listed: string[] = [];
    const outcome = await (async () => {
      for await (const page of c.list({ queue, program, labels, limit: 1 })) {
        listed.push(...page.tasks.map((task) => task.task_id));
      }
      return 'listed';
    })().catch((error: { status?: number; code?: string; reason?: string }) =>
      JSON.stringify([error.status, error.code, error.reason, `after ${listed.length} tasks`]),
    );
    expect(outcome).toBe('listed');
    expect(listed).toEqual([...ids].reverse());
  });
});
