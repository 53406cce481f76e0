/**
 * register() checks what it is given, as it checks the handler, so a
 * misconfiguration fails at startup rather than in every task.
 */
import { describe, expect, it } from 'vitest';
import type { StandardSchemaV1 } from './standard-schema.js';
import { Worker } from './worker.js';

function worker(): Worker {
  return new Worker({
    url: 'http://127.0.0.1:9',
    tenant: 't',
    namespace: 'n',
    queue: 'q',
    concurrency: 1,
  });
}

describe('Worker.register', () => {
  it('refuses a schema without the Standard Schema interface (a zod 3 schema before 3.24, say)', () => {
    const legacy = {
      parse: (v: unknown) => v,
      safeParse: (v: unknown) => ({ success: true, data: v }),
    };
    expect(() =>
      worker().register('p', () => null, { schema: legacy as unknown as StandardSchemaV1 }),
    ).toThrow(TypeError);
    expect(() =>
      worker().register('p', () => null, {
        schema: { '~standard': { version: 1 } } as unknown as StandardSchemaV1,
      }),
    ).toThrow(/Standard Schema/);
  });

  it('takes a Standard Schema that is a function (as arktype types are)', () => {
    const validate = (value: unknown) => ({ value });
    const type = Object.assign((v: unknown) => v, {
      '~standard': { version: 1 as const, vendor: 'fn', validate },
    });
    expect(() => worker().register('p', () => null, { schema: type })).not.toThrow();
  });

  it('refuses a second handler for the same program', () => {
    const w = worker().register('p', () => null);
    expect(() => w.register('p', () => null)).toThrow(/already registered/);
  });
});
