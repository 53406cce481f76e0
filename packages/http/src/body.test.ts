import { gzipSync } from 'node:zlib';
import {
  BATCH_MAX_BYTES,
  ContractError,
  DISPATCH_MAX_BYTES,
  SETTLEMENT_MAX_BYTES,
  SUBMISSION_MAX_BYTES,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { isEncodedContent, isJsonContentType, readBody } from './body.js';
import { expectJson, expectProblem } from './testdata/expect.js';
import {
  ACME_PROD,
  acquireBody,
  assignTask,
  createHarness,
  KEYS,
  openSession,
  scopePath,
  settleBody,
  submitBody,
} from './testdata/harness.js';

const CHUNK = 1024;

/** A body of `total` bytes (spaces after `prefix`), produced on demand, counting what was pulled. */
function countingStream(total: number, prefix = '') {
  const head = new TextEncoder().encode(prefix);
  let produced = 0;
  const stream = new ReadableStream<Uint8Array>(
    {
      pull(controller) {
        if (produced >= total) {
          controller.close();
          return;
        }
        const size = Math.min(CHUNK, total - produced);
        const chunk = new Uint8Array(size).fill(0x20);
        // The JSON document first, then whitespace padding up to `total`.
        for (let i = 0; i < size && produced + i < head.length; i++) {
          chunk[i] = head[produced + i] as number;
        }
        produced += size;
        controller.enqueue(chunk);
      },
    },
    { highWaterMark: 0 },
  );
  return { stream, pulled: () => produced };
}

/** `json` padded with trailing spaces to exactly `size` bytes. */
function padded(json: unknown, size: number): string {
  const text = JSON.stringify(json);
  return text + ' '.repeat(size - Buffer.byteLength(text));
}

describe('isJsonContentType', () => {
  it.each([
    ['application/json', true],
    ['application/json; charset=utf-8', true],
    ['APPLICATION/JSON', true],
    [' application/json ;x=y', true],
    ['application/problem+json', false],
    ['application/jsonx', false],
    ['text/json', false],
    ['text/plain', false],
    ['', false],
  ])('%s → %s', (value, expected) => {
    expect(isJsonContentType(value)).toBe(expected);
  });
});

describe('readBody', () => {
  const request = (
    body: NonNullable<RequestInit['body']> | null,
    headers: Record<string, string>,
  ) =>
    new Request('http://x/', {
      method: 'POST',
      body,
      headers,
      ...(body instanceof ReadableStream ? { duplex: 'half' } : {}),
    } as RequestInit);

  it('stops pulling a streamed body at limit + 1 bytes', async () => {
    const { stream, pulled } = countingStream(64 * 1024 * 1024);
    const error = await readBody(request(stream, { 'content-type': 'application/json' }), 10_000)
      .then(() => undefined)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ContractError);
    expect((error as ContractError).code).toBe('payload_too_large');
    expect(pulled()).toBeGreaterThan(10_000);
    expect(pulled()).toBeLessThanOrEqual(10_000 + 2 * CHUNK);
  });

  it('reads exactly the limit', async () => {
    const { stream, pulled } = countingStream(10_000, '{}');
    const bytes = await readBody(request(stream, { 'content-type': 'application/json' }), 10_000);
    expect(bytes.byteLength).toBe(10_000);
    expect(pulled()).toBe(10_000);
  });

  it('refuses a declared Content-Length above the limit before reading', async () => {
    const { stream, pulled } = countingStream(1_000_000);
    const req = request(stream, {
      'content-type': 'application/json',
      'content-length': '1000000',
    });
    await expect(readBody(req, 10_000)).rejects.toMatchObject({ code: 'payload_too_large' });
    expect(pulled()).toBe(0);
  });

  it('refuses a body of another content type at its first bytes', async () => {
    const { stream, pulled } = countingStream(1_000_000);
    await expect(
      readBody(request(stream, { 'content-type': 'text/plain' }), 10 ** 7),
    ).rejects.toMatchObject({ code: 'unsupported_media_type' });
    expect(pulled()).toBeLessThanOrEqual(2 * CHUNK);
    const untyped = countingStream(1_000_000);
    await expect(readBody(request(untyped.stream, {}), 10 ** 7)).rejects.toMatchObject({
      code: 'unsupported_media_type',
    });
  });

  it('refuses a JSON body in a content coding other than identity at its first bytes (415 content_encoding)', async () => {
    const streamed = countingStream(1_000_000);
    const encoded = { 'content-type': 'application/json', 'content-encoding': 'gzip' };
    await expect(readBody(request(streamed.stream, encoded), 10 ** 7)).rejects.toMatchObject({
      code: 'unsupported_media_type',
      reason: 'content_encoding',
    });
    expect(streamed.pulled()).toBeLessThanOrEqual(2 * CHUNK);
    // A declared length is refused before anything is read.
    const declared = countingStream(1_000_000);
    await expect(
      readBody(request(declared.stream, { ...encoded, 'content-length': '1000000' }), 10 ** 7),
    ).rejects.toMatchObject({ code: 'unsupported_media_type', reason: 'content_encoding' });
    expect(declared.pulled()).toBe(0);
    // identity is no coding at all; another content type is still reported as such.
    const identity = { 'content-type': 'application/json', 'content-encoding': 'Identity' };
    expect(new TextDecoder().decode(await readBody(request('{}', identity), 10))).toBe('{}');
    await expect(
      readBody(request('x', { 'content-type': 'text/plain', 'content-encoding': 'gzip' }), 10),
    ).rejects.toMatchObject({ code: 'unsupported_media_type', reason: 'content_type' });
  });

  it('names every coding but identity as a content coding', () => {
    expect(isEncodedContent(null)).toBe(false);
    expect(isEncodedContent('identity')).toBe(false);
    expect(isEncodedContent(' IDENTITY ')).toBe(false);
    for (const value of ['gzip', 'br', 'deflate', 'x-gzip', 'identity, gzip', 'GZIP']) {
      expect(isEncodedContent(value)).toBe(true);
    }
  });

  it('treats an empty body as no body, whatever the content type', async () => {
    expect((await readBody(request('', { 'content-type': 'text/plain' }), 10)).byteLength).toBe(0);
    expect((await readBody(request(null, {}), 10)).byteLength).toBe(0);
  });

  it('reports a body stream that fails as invalid input', async () => {
    const stream = new ReadableStream<Uint8Array>({
      pull(controller) {
        controller.error(new Error('connection reset'));
      },
    });
    await expect(
      readBody(request(stream, { 'content-type': 'application/json' }), 10),
    ).rejects.toMatchObject({ code: 'invalid_input', reason: 'body_unreadable' });
  });
});

describe('content codings (RFC 9110 §15.5.16)', () => {
  it('refuses a gzip Content-Encoding with 415 unsupported_media_type instead of decoding the compressed bytes as JSON', async () => {
    const h = createHarness();
    const res = await h.call(`${scopePath(ACME_PROD)}/tasks`, {
      key: KEYS.client,
      body: new Uint8Array(gzipSync(JSON.stringify(submitBody(ACME_PROD, 'gz-1')))),
      headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' },
    });
    expect(res.headers.get('accept-encoding')).toBe('identity');
    const problem = await expectProblem(res, 'unsupported_media_type');
    expect(problem.reason).toBe('content_encoding');
  });
});

describe('route body limits', () => {
  it('acquire: 413 at limit + 1 without reading it all; the limit itself is accepted', async () => {
    const h = createHarness();
    const session = await openSession(h);
    const command = acquireBody(session, 0, 1);
    const { stream, pulled } = countingStream(32 * 1024 * 1024, JSON.stringify(command));
    const big = await h.call('/v1/worker/acquire', {
      key: KEYS.worker,
      body: stream,
      headers: { 'content-type': 'application/json' },
    });
    await expectProblem(big, 'payload_too_large');
    expect(pulled()).toBeLessThanOrEqual(DISPATCH_MAX_BYTES + 2 * CHUNK);
    const over = await h.call('/v1/worker/acquire', {
      key: KEYS.worker,
      body: padded(command, DISPATCH_MAX_BYTES + 1),
      headers: { 'content-type': 'application/json' },
    });
    await expectProblem(over, 'payload_too_large');
    const exact = await h.call('/v1/worker/acquire', {
      key: KEYS.worker,
      body: padded(command, DISPATCH_MAX_BYTES),
      headers: { 'content-type': 'application/json' },
    });
    expect(await expectJson(exact, 200)).toEqual({ disposition: 'empty', sequence: 1 });
  });

  it('submit: the limit is SUBMISSION_MAX_BYTES', async () => {
    const h = createHarness();
    const path = `${scopePath(ACME_PROD)}/tasks`;
    const command = submitBody(ACME_PROD, 'big');
    const headers = { 'content-type': 'application/json' };
    await expectProblem(
      await h.call(path, {
        key: KEYS.client,
        body: padded(command, SUBMISSION_MAX_BYTES + 1),
        headers,
      }),
      'payload_too_large',
    );
    const exact = await h.call(path, {
      key: KEYS.client,
      body: padded(command, SUBMISSION_MAX_BYTES),
      headers,
    });
    expect(exact.status).toBe(201);
  });

  it('settle: the limit is SETTLEMENT_MAX_BYTES; batches BATCH_MAX_BYTES', async () => {
    const h = createHarness();
    const { assignment } = await assignTask(h);
    const headers = { 'content-type': 'application/json' };
    await expectProblem(
      await h.call('/v1/worker/settle', {
        key: KEYS.worker,
        body: padded(settleBody(assignment), SETTLEMENT_MAX_BYTES + 1),
        headers,
      }),
      'payload_too_large',
    );
    const exact = await h.call('/v1/worker/settle', {
      key: KEYS.worker,
      body: padded(settleBody(assignment), SETTLEMENT_MAX_BYTES),
      headers,
    });
    expect(exact.status).toBe(200);
    const batch = { commands: [settleBody(assignment)] };
    await expectProblem(
      await h.call('/v1/worker/settle:batch', {
        key: KEYS.worker,
        body: padded(batch, BATCH_MAX_BYTES + 1),
        headers,
      }),
      'payload_too_large',
    );
    const exactBatch = await h.call('/v1/worker/settle:batch', {
      key: KEYS.worker,
      body: padded(batch, BATCH_MAX_BYTES),
      headers,
    });
    expect(exactBatch.status).toBe(200);
  });
});
