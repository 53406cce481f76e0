/**
 * `GET {scope}/tasks` with every filter combined, paged while tasks are submitted,
 * cancelled and (outside the filters) churned between pages; limits at their edges next to a
 * cursor; and a cursor replayed with filters that differ by one detail (DESIGN §4 "Task cursors
 * … bind the scope and the filters … allow a new limit", §4.1 "limit outside 1..500 is 400",
 * "A cursor replayed with other filters or in another scope is 400").
 */
import type { Scope, TaskPage, TaskSnapshot, TaskStatus } from '@ledgence/contracts';
import { submitCommand } from '@ledgence/core/testing';
import { describe, expect, it } from 'vitest';
import { appOverPostgres, scopeFor, tasksPath } from './testdata/app-over-postgres.js';

const call = appOverPostgres('listing_filters', ['client']);

interface Problem {
  status: number;
  code: string;
  reason?: string;
  path?: string;
}

async function submitMany(scope: Scope, commands: unknown[]): Promise<TaskSnapshot[]> {
  const reply = await call<{ results: TaskSnapshot[] }>(`${tasksPath(scope)}:batch`, { commands });
  expect(reply.status).toBe(200);
  return reply.body.results;
}

function newestFirst(a: TaskStatus, b: TaskStatus): number {
  if (a.submitted_at !== b.submitted_at) return b.submitted_at - a.submitted_at;
  return Buffer.compare(Buffer.from(b.task_id), Buffer.from(a.task_id));
}

/** What a test sets of a submitted task; the rest takes the fixture's defaults. */
type Overrides = NonNullable<Parameters<typeof submitCommand>[1]>;

describe('every filter at once, paged under churn', () => {
  it('returns each stable match exactly once, in order, and nothing outside the filters', async () => {
    const scope = scopeFor('all_filters');
    const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
    // Before the window: never listed.
    await submitMany(scope, [
      submitCommand(scope, {
        queue: 'qa',
        program: { name: 'pa' },
        labels: { team: 'red', tier: '1' },
      }),
    ]);
    await sleep(5);
    const variants: Overrides[] = [
      { queue: 'qa', program: { name: 'pa' }, labels: { team: 'red', tier: '1' } }, // match
      {
        queue: 'qa',
        program: { name: 'pa', version: '2' },
        labels: { team: 'red', tier: '1', x: 'y' },
      }, // match
      { queue: 'qb', program: { name: 'pa' }, labels: { team: 'red', tier: '1' } },
      { queue: 'qa', program: { name: 'pb' }, labels: { team: 'red', tier: '1' } },
      { queue: 'qa', program: { name: 'pa' }, labels: { team: 'red' } },
      { queue: 'qa', program: { name: 'pa' }, labels: { team: 'blue', tier: '1' } },
    ];
    const created: TaskSnapshot[] = [];
    for (let round = 0; round < 6; round++) {
      created.push(
        ...(await submitMany(
          scope,
          variants.flatMap((v) => [submitCommand(scope, v), submitCommand(scope, v)]),
        )),
      );
      await sleep(2);
    }
    const from = Math.min(...created.map((t) => t.submitted_at));
    const until = Math.max(...created.map((t) => t.submitted_at)) + 1;
    const filters = `state=queued&queue=qa&program=pa&label.tier=1&label.team=red&submitted_from=${from}&submitted_until=${until}`;
    const before = await call<TaskPage>(`${tasksPath(scope)}?${filters}&limit=500`);
    expect(before.status).toBe(200);
    const matching = before.body.tasks;
    expect(matching.length).toBe(24);
    // Half of the matches are cancelled during the walk (they may or may not be listed); the
    // other half are stable and must be listed exactly once.
    const volatile = new Set(matching.filter((_, i) => i % 2 === 1).map((t) => t.task_id));
    const stable = matching.filter((t) => !volatile.has(t.task_id)).map((t) => t.task_id);
    const victims = [...volatile];
    const seen: TaskStatus[] = [];
    let cursor: string | undefined;
    let pages = 0;
    do {
      const limit = 1 + (pages % 3);
      const after = cursor === undefined ? '' : `&cursor=${cursor}`;
      const page = await call<TaskPage>(`${tasksPath(scope)}?${filters}&limit=${limit}${after}`);
      expect(page.status).toBe(200);
      expect(page.body.tasks.length).toBeLessThanOrEqual(limit);
      seen.push(...page.body.tasks);
      cursor = page.body.next_cursor;
      pages += 1;
      // Between pages: a victim is cancelled, new matching and non-matching tasks arrive.
      const victim = victims.shift();
      if (victim !== undefined) {
        expect((await call(`${tasksPath(scope)}/${victim}/cancel`, {})).status).toBe(200);
      }
      await submitMany(scope, [
        submitCommand(scope, variants[0] as Overrides),
        submitCommand(scope, variants[2] as Overrides),
      ]);
    } while (cursor !== undefined);
    const ids = seen.map((t) => t.task_id);
    expect(ids.length).toBe(new Set(ids).size);
    expect(stable.filter((id) => !ids.includes(id))).toEqual([]);
    // Nothing outside the filters, and strictly in listing order.
    for (const t of seen) {
      expect([t.task_id, t.state, t.queue, t.program.name, t.labels?.team, t.labels?.tier]).toEqual(
        [t.task_id, 'queued', 'qa', 'pa', 'red', '1'],
      );
      expect(t.submitted_at >= from && t.submitted_at < until).toBe(true);
    }
    expect([...seen].sort(newestFirst).map((t) => t.task_id)).toEqual(ids);
  });
});

describe('limits next to a cursor', () => {
  it('a cursor takes limit 1 and 500; 0, 501 and a non-number are 400 naming query.limit, and the cursor still works after', async () => {
    const scope = scopeFor('limits');
    await submitMany(
      scope,
      Array.from({ length: 7 }, () => submitCommand(scope)),
    );
    const first = await call<TaskPage>(`${tasksPath(scope)}?limit=2`);
    const cursor = first.body.next_cursor as string;
    expect(typeof cursor).toBe('string');
    for (const limit of ['0', '501', '-1', '1.0', '', '9007199254740993']) {
      const reply = await call<Problem>(`${tasksPath(scope)}?limit=${limit}&cursor=${cursor}`);
      expect([limit, reply.status, reply.body.code, reply.body.path]).toEqual([
        limit,
        400,
        'invalid_input',
        'query.limit',
      ]);
    }
    const one = await call<TaskPage>(`${tasksPath(scope)}?limit=1&cursor=${cursor}`);
    expect(one.status).toBe(200);
    expect(one.body.tasks.length).toBe(1);
    expect(typeof one.body.next_cursor).toBe('string');
    const rest = await call<TaskPage>(`${tasksPath(scope)}?limit=500&cursor=${cursor}`);
    expect(rest.status).toBe(200);
    expect(rest.body.tasks.length).toBe(5);
    expect(rest.body.next_cursor).toBeUndefined();
    expect(rest.body.tasks[0]?.task_id).toBe(one.body.tasks[0]?.task_id);
    // Exactly `limit` left: the page is full and no cursor follows.
    const exact = await call<TaskPage>(`${tasksPath(scope)}?limit=5&cursor=${cursor}`);
    expect([exact.body.tasks.length, exact.body.next_cursor]).toEqual([5, undefined]);
  });
});

describe('a cursor replayed with filters one detail apart', () => {
  it('is 400 invalid_cursor for each difference, and accepted for the same filters spelled differently', async () => {
    const scope = scopeFor('binding');
    await submitMany(
      scope,
      Array.from({ length: 4 }, () =>
        submitCommand(scope, { queue: 'q b', program: { name: 'p' }, labels: { a: '1', b: '2' } }),
      ),
    );
    const base =
      'queue=q+b&program=p&label.a=1&label.b=2&submitted_from=5&submitted_until=9007199254740991';
    const first = await call<TaskPage>(`${tasksPath(scope)}?${base}&limit=1`);
    expect(first.status).toBe(200);
    const cursor = first.body.next_cursor as string;
    const different = [
      'queue=q+b&program=p&label.a=1&submitted_from=5&submitted_until=9007199254740991',
      'queue=q+b&program=p&label.a=1&label.b=2&label.c=3&submitted_from=5&submitted_until=9007199254740991',
      'queue=q+b&program=p&label.a=1&label.b=3&submitted_from=5&submitted_until=9007199254740991',
      'queue=q+b&program=p&label.a=1&label.b=2&submitted_from=6&submitted_until=9007199254740991',
      'queue=q+b&program=p&label.a=1&label.b=2&submitted_from=5',
      'queue=q+b&program=p&label.a=1&label.b=2&submitted_from=5&submitted_until=9007199254740990',
      'queue=q+b&label.a=1&label.b=2&submitted_from=5&submitted_until=9007199254740991',
      'queue=q+b&program=p&label.a=1&label.b=2&submitted_from=5&submitted_until=9007199254740991&state=queued',
      'queue=q+b&program=p&label.a=1&label.b=2&submitted_from=5&submitted_until=9007199254740991&workflow_id=w',
      // The value of one filter under the name of another.
      'program=q+b&queue=p&label.a=1&label.b=2&submitted_from=5&submitted_until=9007199254740991',
      'queue=q+b&program=p&label.a=2&label.b=1&submitted_from=5&submitted_until=9007199254740991',
    ];
    for (const query of different) {
      const reply = await call<Problem>(`${tasksPath(scope)}?${query}&limit=1&cursor=${cursor}`);
      expect([query, reply.status, reply.body.reason]).toEqual([query, 400, 'invalid_cursor']);
    }
    const same = [
      'label.b=2&label.a=1&submitted_until=9007199254740991&submitted_from=005&program=p&queue=q%20b',
      'queue=q+b&program=%70&label.%61=1&label.b=2&submitted_from=5&submitted_until=9007199254740991',
    ];
    for (const query of same) {
      const reply = await call<TaskPage>(`${tasksPath(scope)}?${query}&limit=500&cursor=${cursor}`);
      expect([query, reply.status, reply.body.tasks.length]).toEqual([query, 200, 3]);
    }
    // The same filters in another namespace of the tenant: refused, and nothing of this one shown.
    const other = scopeFor('binding_other');
    await submitMany(other, [
      submitCommand(other, { queue: 'q b', program: { name: 'p' }, labels: { a: '1', b: '2' } }),
    ]);
    const foreign = await call<Problem>(`${tasksPath(other)}?${base}&cursor=${cursor}`);
    expect([foreign.status, foreign.body.reason]).toEqual([400, 'invalid_cursor']);
  });
});

describe('forged cursors', () => {
  it('odd payloads are 400 invalid_input, never 5xx; a well-formed forged seek stays in the scope', async () => {
    const scope = scopeFor('forged');
    const mine = await submitMany(scope, [submitCommand(scope), submitCommand(scope)]);
    const page = await call<TaskPage>(`${tasksPath(scope)}?limit=1`);
    const cursor = page.body.next_cursor as string;
    const [, binding] = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as [
      number,
      string,
    ];
    const enc = (text: string) => Buffer.from(text, 'utf8').toString('base64url');
    const odd = [
      enc(`[1,"${binding}",1,"\\ud800"]`),
      enc(`\ufeff[1,"${binding}",1,"tsk"]`),
      enc(`[1,["${binding}"],1,"tsk"]`),
      enc(`[1,"${binding}",1,"tsk",5]`),
      enc(`[true,"${binding}",1,"tsk"]`),
      enc(`[1,"${binding}",1e400,"tsk"]`),
      enc(`[1,"${binding}",1,{"toString":1}]`),
      enc(`[1,"${binding}",1,"tsk "]`),
      enc('null'),
      enc('"x"'),
      enc('['.repeat(300) + ']'.repeat(300)),
    ];
    for (const bad of odd) {
      const reply = await call<Problem>(`${tasksPath(scope)}?cursor=${bad}`);
      expect([bad, reply.status, reply.body.code]).toEqual([bad, 400, 'invalid_input']);
    }
    // Whitespace inside the JSON is still this server's layout: accepted, and seeks in this scope.
    const spaced = enc(` [ 1 , "${binding}" , 9007199254740991 , "tsk" ] `);
    const reply = await call<TaskPage>(`${tasksPath(scope)}?cursor=${spaced}`);
    expect(reply.status).toBe(200);
    expect(reply.body.tasks.map((t) => t.task_id).sort()).toEqual(
      mine.map((t) => t.task_id).sort(),
    );
  });
});
