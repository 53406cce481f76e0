/**
 * A client or worker configured with the wrong base URL (a path prefix the server does not have)
 * is answered `404 not_found` by the server for every route: its error says so — which URL it
 * used and that the url setting is what to check — instead of reading like a missing task.
 * The real server, the real SDK.
 */
import { Client, ProblemError, silentLogger } from '@ledgence/worker';
import { describe, expect, it } from 'vitest';
import { NAMESPACE, shortWorker, TENANT, workerSuite } from './test/harness.js';

const suite = workerSuite('wrong_url');

describe('a base URL with a path prefix the server does not have', () => {
  it('fails a client call with the URL it used and the setting to check', async () => {
    const base = `${suite.server.url.replace(/\/+$/, '')}/ledgence`;
    const client = new Client({
      url: base,
      tenant: TENANT,
      namespace: NAMESPACE,
      logger: silentLogger,
    });
    const error = await client.submit({ queue: 'wrong-url', program: 'p', data: null }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(ProblemError);
    const problem = error as ProblemError;
    expect(problem.code).toBe('not_found');
    expect(problem.reason).toBe('no_route');
    expect(problem.message).toContain(
      `POST ${base}/v1/tenants/${TENANT}/namespaces/${NAMESPACE}/tasks`,
    );
    expect(problem.message).toContain(`check that url (${base}) is the server's base URL`);
    // The document stays as the server sent it.
    expect(problem.problem.detail).toBe('no route matches this method and path');
  });

  it('stops a worker with that error', async () => {
    const base = `${suite.server.url.replace(/\/+$/, '')}/ledgence`;
    const worker = shortWorker(base, 'wrong-url');
    suite.workers.push(worker);
    worker.register('p', () => null);
    const error = await worker.run().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(ProblemError);
    expect((error as ProblemError).message).toContain(`POST ${base}/v1/worker/sessions`);
  });

  it('leaves a missing task a plain not_found', async () => {
    const client = new Client({
      url: suite.server.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      logger: silentLogger,
    });
    const error = await client.status('tsk_absent').then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(ProblemError);
    expect((error as ProblemError).reason).toBeUndefined();
    expect((error as ProblemError).message).not.toContain('check that url');
  });
});
