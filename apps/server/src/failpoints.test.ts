import { NO_FAILPOINTS } from '@ledgence/core';
import { describe, expect, it } from 'vitest';
import { replyOperation, serverFailpoints } from './failpoints.js';

describe('the server failpoints', () => {
  it('arm nothing (the shared no-op) unless LEDGENCE_FAILPOINTS names a point', () => {
    expect(serverFailpoints([])).toBe(NO_FAILPOINTS);
    expect(
      serverFailpoints([{ name: 'settle.after_reply', action: 'crash', count: undefined }]).enabled,
    ).toBe(true);
  });

  it.each([
    ['POST', '/v1/tenants/acme/namespaces/prod/tasks', 'submit'],
    ['POST', '/v1/tenants/acme/namespaces/prod/tasks:batch', 'submit'],
    ['POST', '/v1/worker/acquire', 'acquire'],
    ['POST', '/v1/worker/acquire:batch', 'acquire'],
    ['POST', '/v1/worker/renew:batch', 'renew'],
    ['POST', '/v1/worker/settle', 'settle'],
    ['GET', '/v1/tenants/acme/namespaces/prod/tasks', undefined],
    ['POST', '/v1/tenants/acme/namespaces/prod/tasks/t1/cancel', 'cancel'],
    ['POST', '/v1/tenants/acme/namespaces/prod/tasks/t1/subscriptions', undefined],
    ['POST', '/v1/worker/sessions', undefined],
    ['POST', '/v1/worker/quiescence', 'quiescence'],
  ])('maps %s %s to its after-reply point (%s)', (method, path, op) => {
    expect(replyOperation(method, path)).toBe(op);
  });
});
