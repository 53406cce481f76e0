import {
  ERROR_STATUS,
  type ErrorCode,
  MAX_RETENTION_BATCH,
  MAX_RETENTION_MS,
  MAX_SESSION_CONCURRENCY,
  MAX_SUBMIT_BATCH,
  MAX_WORKER_BATCH,
  MIN_RETENTION_MS,
} from '@ledgence/contracts';
import { compileErrors, validate } from '@readme/openapi-parser';
import { beforeAll, describe, expect, it } from 'vitest';
import { componentSchemas, type OperationId, routeErrors } from './openapi.js';
import { createHarness, type Harness } from './testdata/harness.js';

type Operation = {
  operationId: string;
  security?: unknown[];
  parameters?: { in: string; name: string; required?: boolean }[];
  requestBody?: { required: boolean; content: Record<string, { schema: unknown }> };
  responses: Record<
    string,
    { description: string; content?: Record<string, { schema: Record<string, unknown> }> }
  >;
};

type Document = {
  openapi: string;
  info: { title: string; version: string };
  security: Record<string, unknown[]>[];
  paths: Record<string, Record<string, Operation>>;
  components: {
    schemas: Record<string, Record<string, unknown>>;
    securitySchemes: Record<string, { type: string; scheme: string }>;
  };
};

let h: Harness;
let doc: Document;

beforeAll(async () => {
  h = createHarness();
  const res = await h.call('/openapi.json');
  expect(res.status).toBe(200);
  doc = (await res.json()) as Document;
});

/** Every `$ref` anywhere under `value`. */
function refs(value: unknown, out: string[] = []): string[] {
  if (Array.isArray(value)) for (const item of value) refs(item, out);
  else if (typeof value === 'object' && value !== null) {
    for (const [key, item] of Object.entries(value)) {
      if (key === '$ref' && typeof item === 'string') out.push(item);
      else refs(item, out);
    }
  }
  return out;
}

describe('/openapi.json', () => {
  it('is an OpenAPI 3.1 document with a bearer security scheme', () => {
    expect(doc.openapi).toBe('3.1.0');
    expect(doc.info.title).toBe('Ledgence API');
    expect(doc.components.securitySchemes.bearerAuth).toMatchObject({
      type: 'http',
      scheme: 'bearer',
    });
    expect(doc.security).toEqual([{ bearerAuth: [] }]);
  });

  it('validates against the OpenAPI 3.1 schema (@readme/openapi-parser, offline)', async () => {
    // A copy: the parser dereferences the document it is given in place.
    const result = await validate(structuredClone(doc) as never);
    expect(result.valid, result.valid ? '' : compileErrors(result)).toBe(true);
  });

  it('lists every route of the app with its method', () => {
    const routes = h.app.routes
      .filter((route) => route.method !== 'ALL')
      .map(
        (route) =>
          `${route.method.toLowerCase()} ${route.path.replace(/\/:([A-Za-z_]+)/g, '/{$1}')}`,
      );
    const documented = Object.entries(doc.paths).flatMap(([path, item]) =>
      Object.keys(item).map((method) => `${method} ${path}`),
    );
    expect(new Set(documented)).toEqual(new Set(routes));
    expect(documented).toHaveLength(28);
    expect(documented.filter((entry) => entry.includes('completion'))).toHaveLength(3);
    expect(documented.filter((entry) => entry.includes('retention'))).toHaveLength(3);
  });

  it('documents only mounted routes: no completions or retention without their services', async () => {
    const bare = createHarness({ completions: undefined, retention: undefined });
    const res = await bare.call('/openapi.json');
    const { paths } = (await res.json()) as Document;
    expect(Object.values(paths).flatMap((item) => Object.keys(item))).toHaveLength(22);
    expect(Object.keys(paths).filter((path) => /completion|retention/.test(path))).toEqual([]);
  });

  it('gives every operation its success reply, problem+json errors and security', () => {
    for (const [path, item] of Object.entries(doc.paths)) {
      for (const [method, operation] of Object.entries(item)) {
        const id = operation.operationId as OperationId;
        const open = ['/healthz', '/readyz', '/metrics', '/openapi.json'].includes(path);
        if (open) expect(operation.security, `${method} ${path}`).toEqual([]);
        else expect(operation.security, `${method} ${path}`).toBeUndefined();
        const statuses = Object.keys(operation.responses).map(Number);
        expect(
          statuses.some((s) => s >= 200 && s < 300),
          `${id} success`,
        ).toBe(true);
        const expected = new Map<number, ErrorCode[]>();
        for (const code of routeErrors(id)) {
          expected.set(ERROR_STATUS[code], [...(expected.get(ERROR_STATUS[code]) ?? []), code]);
        }
        for (const [status, codes] of expected) {
          const response = operation.responses[String(status)];
          expect(response, `${id} ${status}`).toBeDefined();
          const schema = response?.content?.['application/problem+json']?.schema as {
            allOf: [{ $ref: string }, { properties: { code: { enum: string[] } } }];
          };
          expect(schema.allOf[0].$ref).toBe('#/components/schemas/Problem');
          expect(schema.allOf[1].properties.code.enum).toEqual(codes);
        }
        if (!open) {
          for (const status of [400, 401, 403, 503]) {
            expect(operation.responses[String(status)], `${id} ${status}`).toBeDefined();
          }
        }
        if (method === 'post' || method === 'put') {
          expect(operation.requestBody?.content['application/json'], id).toBeDefined();
          expect(operation.responses['413'], id).toBeDefined();
          expect(operation.responses['415'], id).toBeDefined();
        }
        for (const name of path.match(/\{([a-z_]+)\}/g) ?? []) {
          const param = operation.parameters?.find((p) => `{${p.name}}` === name);
          expect(param, `${id} ${name}`).toMatchObject({ in: 'path', required: true });
        }
      }
    }
  });

  it('documents the routes the spec calls out', () => {
    const tasks = doc.paths['/v1/tenants/{tenant_id}/namespaces/{namespace}/tasks'];
    expect(Object.keys(tasks?.post?.responses ?? {})).toEqual(
      expect.arrayContaining(['200', '201', '409']),
    );
    expect(tasks?.post?.parameters?.map((p) => p.name)).toContain('Idempotency-Key');
    expect(tasks?.get?.parameters?.map((p) => p.name)).toEqual(
      expect.arrayContaining(['state', 'queue', 'limit', 'cursor']),
    );
    const extend = doc.paths['/v1/worker/sessions/{session_id}/extend']?.post;
    expect(extend?.requestBody?.required).toBe(false);
    expect(Object.keys(extend?.responses ?? {})).toEqual(expect.arrayContaining(['404', '410']));
    const acquire = doc.paths['/v1/worker/acquire']?.post;
    expect(acquire?.parameters?.map((p) => p.name)).toEqual(['wait_ms', 'X-Request-Id']);
    expect(acquire?.responses['409']?.description).toMatch(/consumer_busy.*sequence_conflict/);
  });

  it('documents the completion and retention routes', () => {
    const scope = '/v1/tenants/{tenant_id}/namespaces/{namespace}';
    const subscriptions = doc.paths[`${scope}/tasks/{task_id}/completion-subscriptions`];
    expect(Object.keys(subscriptions?.post?.responses ?? {})).toEqual(
      expect.arrayContaining(['200', '201', '400', '404', '409', '413', '415']),
    );
    expect(subscriptions?.post?.responses['409']?.description).toMatch(/conflict.*limit_exceeded/);
    expect(subscriptions?.get?.responses['200']?.content?.['application/json']?.schema).toEqual({
      $ref: '#/components/schemas/CompletionSubscriptionList',
    });
    const redeliver = doc.paths[`${scope}/completion-subscriptions/{subscription_id}/redeliver`];
    expect(redeliver?.post?.requestBody?.content['application/json']?.schema).toEqual({
      $ref: '#/components/schemas/CompletionRetryCommand',
    });
    const policy = doc.paths[`${scope}/retention-policy`];
    expect(policy?.put?.requestBody?.required).toBe(true);
    expect(policy?.get?.responses['200']?.content?.['application/json']?.schema).toEqual({
      $ref: '#/components/schemas/RetentionPolicy',
    });
    const preview = doc.paths[`${scope}/retention-policy/preview`]?.get;
    expect(preview?.parameters?.find((p) => p.in === 'query')).toMatchObject({
      name: 'limit',
      schema: { type: 'integer', minimum: 1, maximum: MAX_RETENTION_BATCH },
    });
    const command = doc.components.schemas.SetRetentionPolicyCommand as {
      properties: Record<string, unknown>;
    };
    expect(command.properties.retention_ms).toEqual({
      type: 'integer',
      minimum: MIN_RETENTION_MS,
      maximum: MAX_RETENTION_MS,
    });
  });

  it('resolves every $ref to a component schema', () => {
    for (const ref of refs(doc)) {
      const name = ref.replace('#/components/schemas/', '');
      expect(doc.components.schemas[name], ref).toBeDefined();
    }
  });

  it('converts the contract schemas, optional reply fields not required', () => {
    const schemas = componentSchemas();
    const status = schemas.TaskStatus as {
      required: string[];
      properties: Record<string, unknown>;
    };
    expect(status.required).not.toContain('labels');
    expect(status.required).not.toContain('workflow_id');
    expect(status.required).toContain('terminal_at');
    expect(status.properties.labels).toEqual({ $ref: '#/components/schemas/Labels' });
    const snapshot = schemas.TaskSnapshot as { required: string[] };
    expect(snapshot.required).not.toContain('parent_workflow_id');
    expect(snapshot.required).toContain('origin_trace');
    const problem = schemas.Problem as { required: string[] };
    expect(problem.required.sort()).toEqual(['code', 'detail', 'status', 'title', 'type']);
    expect(schemas.Labels).toMatchObject({
      type: 'object',
      additionalProperties: { type: 'string' },
    });
    const submit = schemas.SubmitTask as { required: string[] };
    expect(submit.required.sort()).toEqual(['data', 'namespace', 'program', 'queue', 'tenant_id']);
    for (const schema of Object.values(schemas)) expect(schema.$schema).toBeUndefined();
    const acquire = schemas.AcquireCommand as { properties: Record<string, unknown> };
    expect(acquire.properties.sequence).toEqual({
      type: 'integer',
      minimum: 0,
      maximum: Number.MAX_SAFE_INTEGER,
    });
    expect(acquire.properties.consumer_id).toEqual({ type: 'integer', minimum: 0, maximum: 999 });
    expect(status.properties.submitted_at).toMatchObject({ type: 'integer', minimum: 0 });
  });

  it('states the 1..N item bounds of every batch request body that the server enforces', () => {
    const bounds: Record<string, number> = {
      SubmitBatchRequest: MAX_SUBMIT_BATCH, // DESIGN §6: "{commands: SubmitCommand[]} (≤ 1 000)"
      AcquireBatchRequest: MAX_SESSION_CONCURRENCY,
      RenewBatchRequest: MAX_WORKER_BATCH,
      SettleBatchRequest: MAX_WORKER_BATCH,
    };
    for (const [name, max] of Object.entries(bounds)) {
      const schema = doc.components.schemas[name] as {
        properties: Record<string, Record<string, unknown>>;
      };
      const commands = schema.properties.commands;
      // The server answers 400 "$.commands must hold 1 to N items" outside these bounds.
      expect({ name, minItems: commands?.minItems, maxItems: commands?.maxItems }).toEqual({
        name,
        minItems: 1,
        maxItems: max,
      });
    }
  });

  it('carries no validation response that describes echoed input', () => {
    expect(JSON.stringify(doc)).not.toContain('Validation Error');
  });
});
