/**
 * `createHttpApp` refuses to build an app in which a route declares no
 * authorization policy. One route's policy is taken away by mocking the
 * documentation middleware it is registered with.
 */
import { describeRoute } from 'hono-openapi';
import { expect, it, vi } from 'vitest';
import { createHarness } from './testdata/harness.js';

vi.mock('./openapi.js', async (importOriginal) => {
  const actual = await importOriginal<typeof import('./openapi.js')>();
  return {
    ...actual,
    // The cancel route keeps its documentation but loses its policy.
    documentRoute: (id: Parameters<typeof actual.documentRoute>[0]) =>
      id === 'cancelTask' ? describeRoute({ operationId: id }) : actual.documentRoute(id),
  };
});

it('throws at creation, naming the route without a policy', () => {
  expect(() => createHarness()).toThrow(
    /POST \/v1\/tenants\/:tenant_id\/namespaces\/:namespace\/tasks\/:task_id\/cancel declares no authorization policy/,
  );
});
