/** Assertions shared by the HTTP tests. */
import {
  ERROR_STATUS,
  type ErrorCode,
  type Problem,
  ProblemSchema,
  type Scope,
} from '@ledgence/contracts';
import * as v from 'valibot';
import { expect } from 'vitest';
import { ACME_DEV, ACME_PROD, GLOBEX_PROD, type Harness } from './harness.js';

/** Every scope the harness's keys are bound to. */
const SCOPES: readonly Scope[] = [ACME_PROD, ACME_DEV, GLOBEX_PROD];

/**
 * Asserts that `res` is a problem+json reply with `code` (and its status),
 * a well-formed RFC 9457 body and the request id echoed; returns the body.
 */
export async function expectProblem(res: Response, code: ErrorCode): Promise<Problem> {
  const text = await res.text();
  expect({ status: res.status, body: text }).toMatchObject({ status: ERROR_STATUS[code] });
  expect(res.headers.get('content-type')).toBe('application/problem+json');
  const body = JSON.parse(text) as Problem;
  expect(v.safeParse(ProblemSchema, body).success).toBe(true);
  expect(body.code).toBe(code);
  expect(body.type).toBe(`https://ledgence.dev/problems/${code}`);
  expect(body.request_id).toBe(res.headers.get('x-request-id'));
  return body;
}

/** Asserts a JSON reply with `status` and returns its body. */
export async function expectJson<T = unknown>(res: Response, status: number): Promise<T> {
  const text = await res.text();
  expect({ status: res.status, body: text }).toMatchObject({ status });
  expect(res.headers.get('content-type')).toMatch(/^application\/json/);
  return JSON.parse(text) as T;
}

/**
 * Runs `request` and asserts it was refused with `code` and changed nothing the store holds, in
 * any scope of the harness (DESIGN: bad input changes nothing).
 */
export async function refusedUnchanged(
  h: Harness,
  request: () => Promise<Response>,
  code: ErrorCode,
): Promise<void> {
  const before = await h.dump(SCOPES);
  await expectProblem(await request(), code);
  expect(await h.dump(SCOPES)).toBe(before);
}
