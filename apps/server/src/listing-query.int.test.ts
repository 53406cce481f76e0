/**
 * `GET {scope}/tasks` over the real PostgreSQL store (DESIGN §6, §4.1 "Filters",
 * "Status codes"): how the query string is decoded, and keyset paging through ties.
 */
import type { Scope, TaskPage, TaskSnapshot } from '@ledgence/contracts';
import { submitCommand } from '@ledgence/core/testing';
import { describe, expect, it } from 'vitest';
import { appOverPostgres, scopeFor, tasksPath } from './testdata/app-over-postgres.js';

const call = appOverPostgres('listing_query', ['client']);

/** A problem document (DESIGN §6). */
interface Problem {
  status: number;
  code: string;
  detail: string;
}

/** Every task id of a listing, page by page, newest first. */
async function walk(scope: Scope, query: string, limit: number): Promise<string[]> {
  const ids: string[] = [];
  let cursor: string | undefined;
  do {
    const after = cursor === undefined ? '' : `&cursor=${cursor}`;
    const page = await call<TaskPage>(`${tasksPath(scope)}?${query}&limit=${limit}${after}`);
    expect(page.status).toBe(200);
    ids.push(...page.body.tasks.map((task) => task.task_id));
    cursor = page.body.next_cursor;
  } while (cursor !== undefined);
  return ids;
}

describe('GET {scope}/tasks query decoding', () => {
  it('refuses percent-encoded bytes that are not UTF-8 instead of matching them as U+FFFD', async () => {
    const scope = scopeFor('not_utf8');
    const command = submitCommand(scope, { labels: { team: '\ufffd' } });
    expect((await call<TaskSnapshot>(tasksPath(scope), command)).status).toBe(201);
    // `%FF`, `%E9` (Latin-1 é) and an encoded surrogate are not UTF-8: decoded leniently, each
    // became U+FFFD and listed a task no client asked for. Bodies are decoded fatally; so is this.
    for (const query of ['label.team=%FF', 'label.team=%E9', 'label.team=%ED%A0%80', 'queue=%C3']) {
      const reply = await call<Problem>(`${tasksPath(scope)}?${query}`);
      expect([query, reply.status, reply.body.code]).toEqual([query, 400, 'invalid_input']);
      expect(reply.body.detail).not.toContain('\ufffd');
    }
    // Also in a parameter's name.
    const named = await call<Problem>(`${tasksPath(scope)}?label.%FF=x`);
    expect([named.status, named.body.code]).toEqual([400, 'invalid_input']);
  });

  it('still decodes what URLSearchParams does: `+` as space, %2B, a lone `%`, UTF-8 escapes', async () => {
    const scope = scopeFor('decoding');
    const labels = { 'a=b&c': 'x y+%', é: '\ufffd', '%zz': '100%' };
    const command = submitCommand(scope, { labels });
    const created = await call<TaskSnapshot>(tasksPath(scope), command);
    expect(created.status).toBe(201);
    const query = [
      'label.a%3Db%26c=x+y%2B%25',
      'label.%C3%A9=%EF%BF%BD',
      'label.%zz=100%',
      '',
      'limit=10',
    ].join('&');
    const page = await call<TaskPage>(`${tasksPath(scope)}?${query}`);
    expect(page.status).toBe(200);
    expect(page.body.tasks.map((task) => task.task_id)).toEqual([created.body.task_id]);
  });
});

describe('GET {scope}/tasks paging', () => {
  it('walks tasks sharing one submitted_at without a gap or a repeat, at any limit', async () => {
    const scope = scopeFor('ties');
    // One batch: one store time for every task, so task ids alone order them.
    const commands = Array.from({ length: 23 }, (_, i) =>
      submitCommand(scope, { labels: { 'k=&%': 'v&=é', n: String(i % 2) } }),
    );
    const batch = await call<{ results: TaskSnapshot[] }>(`${tasksPath(scope)}:batch`, {
      commands,
    });
    expect(batch.status).toBe(200);
    expect(new Set(batch.body.results.map((task) => task.submitted_at)).size).toBe(1);
    const ids = batch.body.results.map((task) => task.task_id);
    const newestFirst = [...ids].sort((a, b) => Buffer.compare(Buffer.from(b), Buffer.from(a)));
    for (const limit of [1, 2, 5, 22, 23, 500]) {
      expect(await walk(scope, 'state=queued', limit)).toEqual(newestFirst);
    }
    const odd = ids.filter((_, i) => i % 2 === 1);
    const both = `label.${encodeURIComponent('k=&%')}=${encodeURIComponent('v&=é')}&label.n=1`;
    expect(await walk(scope, both, 3)).toEqual(newestFirst.filter((id) => odd.includes(id)));
  });
});
