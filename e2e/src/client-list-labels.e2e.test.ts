/**
 * Review of the SDK's `Client.list` against the real server process: labels whose keys and
 * values hold the characters a query string gives meaning to, across pages.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { client, Stack } from './test/harness.js';

const stack = new Stack('client_list_labels');
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  server = await stack.start();
});
afterAll(async () => {
  await stack.close();
});

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
    const listed: string[] = [];
    for await (const page of c.list({ labels, limit: 2 })) {
      listed.push(...page.tasks.map((task) => task.task_id));
    }
    expect([...listed].sort()).toEqual([...ids].sort());
  });
});
