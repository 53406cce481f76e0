/**
 * DESIGN §12 limits at the edges the other limit tests leave open (limits.test.ts, body.test.ts,
 * malformed.test.ts, completions.test.ts; apps/server limits.int and edge.int): a cursor of
 * exactly TASK_CURSOR_MAX_BYTES, a page cut by TASK_PAGE_MAX_BYTES as the HTTP reply writes it,
 * SUBMISSION_DATA_MAX_BYTES inside a batch and under an `Idempotency-Key` header, the completion
 * limits' refusals writing nothing, COMPLETION_EVENT_MAX_BYTES (no request can reach it) held at
 * its exact edge in the contracts, and DISPATCH_MAX_BYTES on URI references (the acquire body's
 * edge is in body.test.ts and malformed.test.ts).
 */
import {
  buildCompletionEvent,
  COMPLETION_EVENT_MAX_BYTES,
  COMPLETION_MAX_GENERATION,
  type CompletionEventInput,
  type CompletionSubscription,
  ContractError,
  canonicalJson,
  DISPATCH_MAX_BYTES,
  MAX_COMPLETION_SUBSCRIPTIONS,
  NAME_MAX_BYTES,
  parseWith,
  SCOPE_TEXT_MAX_BYTES,
  type Scope,
  SUBMISSION_DATA_MAX_BYTES,
  TASK_CURSOR_MAX_BYTES,
  TASK_PAGE_MAX_BYTES,
  TASK_STATUS_MAX_BYTES,
  type TaskPage,
  type TaskSnapshot,
  type TaskStatus,
  UriReferenceSchema,
  utf8ByteLength,
} from '@ledgence/contracts';
import { submitCommandWithStatusBytes } from '@ledgence/core/testing';
import { describe, expect, it } from 'vitest';
import { expectJson, expectProblem, refusedUnchanged } from './testdata/expect.js';
import {
  ACME_PROD,
  createHarness,
  deliverDue,
  type Harness,
  KEYS,
  redeliverPath,
  scopePath,
  submitBody,
  submitTask,
  subscribeBody,
  subscriptionsPath,
} from './testdata/harness.js';

const tasksPath = `${scopePath(ACME_PROD)}/tasks`;

function list(h: Harness, query: string): Promise<Response> {
  return h.call(`${tasksPath}?${query}`, { key: KEYS.client });
}

describe('TASK_CURSOR_MAX_BYTES over HTTP', () => {
  it(`a cursor of exactly ${TASK_CURSOR_MAX_BYTES} characters is served; one character more is 400 for its length alone`, async () => {
    const h = createHarness();
    for (let i = 0; i < 3; i++) await submitTask(h, ACME_PROD, KEYS.client);
    const first = await expectJson<TaskPage>(await list(h, 'limit=1'), 200);
    const issued = first.next_cursor ?? '';
    const expected = await expectJson<TaskPage>(await list(h, `limit=1&cursor=${issued}`), 200);

    // Server cursors are far shorter than the limit; JSON whitespace inside one keeps its meaning,
    // so padding its payload to 3/4 of the limit gives a valid cursor exactly at the limit.
    const payload = Buffer.from(issued, 'base64url').toString('utf8');
    const width = (TASK_CURSOR_MAX_BYTES / 4) * 3;
    const padded = `${payload.slice(0, -1)}${' '.repeat(width - payload.length)}]`;
    const exact = Buffer.from(padded, 'utf8').toString('base64url');
    expect(exact).toHaveLength(TASK_CURSOR_MAX_BYTES);
    expect(await expectJson<TaskPage>(await list(h, `limit=1&cursor=${exact}`), 200)).toEqual(
      expected,
    );

    // A trailing lone base64url character decodes to nothing: only the length can refuse this one.
    const over = `${exact}A`;
    expect(Buffer.from(over, 'base64url').equals(Buffer.from(exact, 'base64url'))).toBe(true);
    const refused = await expectProblem(await list(h, `limit=1&cursor=${over}`), 'invalid_input');
    expect(refused.path).toBe('query.cursor');
    expect(refused.detail).toContain(String(TASK_CURSOR_MAX_BYTES));
  });
});

describe('TASK_PAGE_MAX_BYTES over HTTP', () => {
  it('a page of the widest statuses is at most the limit as sent, and was cut only because the next status would not fit', async () => {
    const h = createHarness();
    const count = 200;
    const commands = Array.from({ length: count }, (_, i) =>
      submitCommandWithStatusBytes(ACME_PROD, TASK_STATUS_MAX_BYTES, {
        idempotency_key: `wide-${i}`,
      }),
    );
    const submitted = await expectJson<{ results: TaskSnapshot[] }>(
      await h.call(`${tasksPath}:batch`, { key: KEYS.client, json: { commands } }),
      200,
    );
    expect(submitted.results.every((r) => r.state === 'queued')).toBe(true);

    const pages: { text: string; page: TaskPage }[] = [];
    let cursor: string | undefined;
    do {
      const res = await list(h, `limit=500${cursor === undefined ? '' : `&cursor=${cursor}`}`);
      expect(res.status).toBe(200);
      const text = await res.text();
      const page = JSON.parse(text) as TaskPage;
      pages.push({ text, page });
      cursor = page.next_cursor;
    } while (cursor !== undefined);

    expect(pages.length).toBeGreaterThan(1);
    const seen = pages.flatMap(({ page }) => page.tasks.map((t) => t.task_id));
    expect(new Set(seen).size).toBe(count);
    for (const [index, { text, page }] of pages.entries()) {
      expect(utf8ByteLength(text)).toBeLessThanOrEqual(TASK_PAGE_MAX_BYTES);
      const next: TaskStatus | undefined = pages[index + 1]?.page.tasks[0];
      if (next === undefined) continue;
      // The page reserves room for the longest cursor, whatever its own cursor's length.
      const counted =
        utf8ByteLength(text) - (page.next_cursor ?? '').length + TASK_CURSOR_MAX_BYTES;
      expect(counted + 1 + utf8ByteLength(JSON.stringify(next))).toBeGreaterThan(
        TASK_PAGE_MAX_BYTES,
      );
    }
  });
});

describe('SUBMISSION_DATA_MAX_BYTES on the other submit forms', () => {
  const atLimit = 'x'.repeat(SUBMISSION_DATA_MAX_BYTES - 2);

  it('tasks:batch: the item at the limit is queued, the item one byte over is its own 413 and is not written', async () => {
    const h = createHarness();
    const reply = await expectJson<{ results: [Record<string, unknown>, Record<string, unknown>] }>(
      await h.call(`${tasksPath}:batch`, {
        key: KEYS.client,
        json: {
          commands: [
            submitBody(ACME_PROD, 'over', { data: `${atLimit}x` }),
            submitBody(ACME_PROD, 'at', { data: atLimit }),
          ],
        },
      }),
      200,
    );
    const [refused, created] = reply.results;
    expect(refused).toMatchObject({
      status: 413,
      code: 'payload_too_large',
      path: '$.commands[0].input.data',
    });
    expect(created).toMatchObject({ state: 'queued', idempotency_key: 'at' });
    const page = await expectJson<TaskPage>(await list(h, 'limit=500'), 200);
    expect(page.tasks.map((t) => t.task_id)).toEqual([created.task_id]);
    // The refused key was not taken: under it, a valid command creates a task.
    await expectJson(
      await h.call(tasksPath, { key: KEYS.client, json: submitBody(ACME_PROD, 'over') }),
      201,
    );
  });

  it('Idempotency-Key header form: data at the limit is 201; one byte more is 413 and writes nothing', async () => {
    const h = createHarness();
    const send = (key: string, data: string) => {
      const { idempotency_key: _key, ...body } = submitBody(ACME_PROD, key, { data });
      return h.call(tasksPath, {
        key: KEYS.client,
        json: body,
        headers: { 'idempotency-key': key },
      });
    };
    await refusedUnchanged(h, () => send('over', `${atLimit}x`), 'payload_too_large');
    const created = await expectJson<TaskSnapshot>(await send('at', atLimit), 201);
    expect(created.input.data).toBe(atLimit);
  });
});

describe('completion limits write nothing when they refuse', () => {
  const subscribe = (h: Harness, taskId: string, key: string) =>
    h.call(subscriptionsPath(ACME_PROD, taskId), { key: KEYS.client, json: subscribeBody(key) });

  it(`subscription ${MAX_COMPLETION_SUBSCRIPTIONS + 1} of a task is 409 limit_exceeded and changes nothing`, async () => {
    const h = createHarness();
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    for (let i = 1; i <= MAX_COMPLETION_SUBSCRIPTIONS; i++) {
      await expectJson(await subscribe(h, task.task_id, `sub-${i}`), 201);
    }
    await refusedUnchanged(h, () => subscribe(h, task.task_id, 'one-more'), 'limit_exceeded');
  });

  it(`redelivering generation ${COMPLETION_MAX_GENERATION} is 409 limit_exceeded and changes nothing`, async () => {
    const h = createHarness();
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    const created = await expectJson<CompletionSubscription>(
      await subscribe(h, task.task_id, 'gen'),
      201,
    );
    await expectJson(
      await h.call(`${tasksPath}/${task.task_id}/cancel`, { method: 'POST', key: KEYS.client }),
      200,
    );
    await deliverDue(h, { state: 'delivered' });
    const redeliver = (generation: number) =>
      h.call(redeliverPath(ACME_PROD, created.id), { key: KEYS.client, json: { generation } });
    for (let generation = 1; generation < COMPLETION_MAX_GENERATION; generation++) {
      await expectJson(await redeliver(generation), 200);
      await deliverDue(h, { state: 'delivered' });
    }
    await refusedUnchanged(h, () => redeliver(COMPLETION_MAX_GENERATION), 'limit_exceeded');
  });
});

describe('COMPLETION_EVENT_MAX_BYTES', () => {
  /** Identifier text of `length` characters, the first `quotes` of them `"` (two bytes in JSON, three in a URI). */
  const quoted = (length: number, quotes: number, fill: string) =>
    '"'.repeat(quotes) + fill.repeat(length - quotes);

  it('the widest event a request can lead to fits: quoted scope and queue names through HTTP', async () => {
    const scope: Scope = {
      tenant_id: quoted(SCOPE_TEXT_MAX_BYTES, SCOPE_TEXT_MAX_BYTES, ''),
      namespace: '\\'.repeat(SCOPE_TEXT_MAX_BYTES),
    };
    const queue = quoted(NAME_MAX_BYTES, NAME_MAX_BYTES, '');
    const key = 'quoted-key';
    const h = createHarness({
      auth: { keys: [{ key, tenant: scope.tenant_id, namespaces: ['*'], roles: ['client'] }] },
    });
    const path = `${scopePath(scope)}/tasks`;
    const task = await expectJson<TaskSnapshot>(
      await h.call(path, { key, json: submitBody(scope, 'k', { queue }) }),
      201,
    );
    const subscription = await expectJson<CompletionSubscription>(
      await h.call(`${path}/${encodeURIComponent(task.task_id)}/completion-subscriptions`, {
        key,
        json: subscribeBody('s'),
      }),
      201,
    );
    await expectJson(
      await h.call(`${path}/${encodeURIComponent(task.task_id)}/cancel`, { method: 'POST', key }),
      200,
    );
    const status = await expectJson<TaskStatus>(
      await h.call(`${path}/${encodeURIComponent(task.task_id)}`, { key }),
      200,
    );
    const event = buildCompletionEvent({
      scope,
      queue,
      task_id: task.task_id,
      run_id: task.run_id,
      state: 'cancelled',
      event_id: subscription.event_id,
      time: status.terminal_at ?? 0,
    });
    expect(utf8ByteLength(canonicalJson(event))).toBeLessThanOrEqual(COMPLETION_EVENT_MAX_BYTES);
  });

  it(`an event of exactly ${COMPLETION_EVENT_MAX_BYTES} bytes is built; one byte more is payload_too_large`, () => {
    // Each quote in the task id adds 4 bytes (subject, data.task_id, and %22 in result_ref); each
    // in the run id or event id adds 1; identifiers no server issues, to reach the edge at all.
    const input = (taskQuotes: number, runQuotes: number, eventQuotes: number) =>
      ({
        scope: {
          tenant_id: quoted(SCOPE_TEXT_MAX_BYTES, SCOPE_TEXT_MAX_BYTES, ''),
          namespace: quoted(SCOPE_TEXT_MAX_BYTES, SCOPE_TEXT_MAX_BYTES, ''),
        },
        queue: quoted(NAME_MAX_BYTES, NAME_MAX_BYTES, ''),
        task_id: quoted(NAME_MAX_BYTES, taskQuotes, 'k'),
        run_id: quoted(NAME_MAX_BYTES, runQuotes, 'r'),
        state: 'succeeded',
        event_id: quoted(NAME_MAX_BYTES, eventQuotes, 'e'),
        time: 1_700_000_000_000,
      }) satisfies CompletionEventInput;
    const bytes = (event: unknown) => utf8ByteLength(canonicalJson(event));
    const missing = COMPLETION_EVENT_MAX_BYTES - bytes(buildCompletionEvent(input(0, 0, 0)));
    const taskQuotes = Math.floor(missing / 4);
    const runQuotes = missing - 4 * taskQuotes;
    expect(taskQuotes).toBeLessThanOrEqual(NAME_MAX_BYTES);
    expect(bytes(buildCompletionEvent(input(taskQuotes, runQuotes, 0)))).toBe(
      COMPLETION_EVENT_MAX_BYTES,
    );
    let error: unknown;
    try {
      buildCompletionEvent(input(taskQuotes, runQuotes, 1));
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(ContractError);
    expect((error as ContractError).code).toBe('payload_too_large');
  });
});

describe('DISPATCH_MAX_BYTES', () => {
  it(`a URI reference (event source, result_ref) of ${DISPATCH_MAX_BYTES} bytes is valid; one byte more is invalid_input`, () => {
    const exact = `/${'é'.repeat((DISPATCH_MAX_BYTES - 2) / 2)}x`;
    expect(utf8ByteLength(exact)).toBe(DISPATCH_MAX_BYTES);
    expect(parseWith(UriReferenceSchema, exact)).toBe(exact);
    let error: unknown;
    try {
      parseWith(UriReferenceSchema, `${exact}x`);
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(ContractError);
    expect((error as ContractError).code).toBe('invalid_input');
  });
});
