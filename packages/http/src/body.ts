/**
 * Request bodies, read the way DESIGN §4.1 and §6 require: the content type
 * is checked before anything is read (415), the byte limit of the route is
 * enforced while the body streams in (413 as soon as limit + 1 bytes have
 * arrived; a declared `Content-Length` above the limit is refused before
 * reading), and the bytes go to the contracts' strict decoder unparsed.
 */
import { ContractError } from '@ledgence/contracts';

const EMPTY = new Uint8Array(0);

/**
 * Whether a `Content-Type` value is `application/json`, with any parameters
 * (`; charset=utf-8`), compared case-insensitively as RFC 9110 says media
 * types are.
 */
export function isJsonContentType(value: string): boolean {
  const semicolon = value.indexOf(';');
  const essence = (semicolon === -1 ? value : value.slice(0, semicolon)).trim().toLowerCase();
  return essence === 'application/json';
}

function unsupportedMediaType(): ContractError {
  return new ContractError(
    'unsupported_media_type',
    'the request body must be sent with Content-Type: application/json',
    { reason: 'content_type' },
  );
}

/**
 * Whether a `Content-Encoding` value names a coding other than `identity`: the server decodes
 * none (RFC 9110 §8.4), so such a body is refused unread rather than decoded as JSON.
 */
export function isEncodedContent(value: string | null): boolean {
  if (value === null) return false;
  for (const coding of value.split(',')) {
    const name = coding.trim().toLowerCase();
    if (name !== '' && name !== 'identity') return true;
  }
  return false;
}

function unsupportedEncoding(): ContractError {
  return new ContractError(
    'unsupported_media_type',
    'the request body must be sent without a Content-Encoding (identity): the server decodes no content coding',
    { reason: 'content_encoding' },
  );
}

/** The refusal of a non-empty body the server will not read: its type, then its coding. */
function unreadable(json: boolean): ContractError {
  return json ? unsupportedEncoding() : unsupportedMediaType();
}

function payloadTooLarge(limit: number): ContractError {
  return new ContractError(
    'payload_too_large',
    `the request body must be at most ${limit} bytes on this route`,
    { reason: 'body_limit' },
  );
}

/** A well-formed `Content-Length`, or `undefined` when absent or malformed. */
function declaredLength(value: string | null): number | undefined {
  if (value === null || !/^\d{1,16}$/.test(value.trim())) return undefined;
  return Number(value.trim());
}

function concat(chunks: readonly Uint8Array[], total: number): Uint8Array {
  if (chunks.length === 1) return chunks[0] as Uint8Array;
  const out = new Uint8Array(total);
  let at = 0;
  for (const chunk of chunks) {
    out.set(chunk, at);
    at += chunk.byteLength;
  }
  return out;
}

/**
 * Reads `request`'s body as bytes, at most `limit` of them. An empty body
 * (none at all, or zero bytes) is returned as an empty array whatever the
 * content type says; a non-empty body must be `application/json` without a
 * content coding (`Content-Encoding` absent or `identity`).
 *
 * Throws `unsupported_media_type` for a non-empty body of another (or no)
 * content type (reason `content_type`) or with a content coding such as gzip
 * (reason `content_encoding`), and `payload_too_large` when the declared length
 * or the bytes read exceed `limit`; in all these cases the rest of the body is not read.
 */
export async function readBody(request: Request, limit: number): Promise<Uint8Array> {
  const contentType = request.headers.get('content-type');
  const json = contentType !== null && isJsonContentType(contentType);
  // Readable: JSON in no content coding. Anything else is refused at its first byte.
  const readable = json && !isEncodedContent(request.headers.get('content-encoding'));
  const declared = declaredLength(request.headers.get('content-length'));
  if (declared !== undefined && declared > 0) {
    if (!readable) throw unreadable(json);
    if (declared > limit) throw payloadTooLarge(limit);
  }
  if (declared !== undefined && declared <= limit) {
    // A declared length within the limit bounds the body already (the HTTP parser frames it),
    // so it is read whole, without a stream: on @hono/node-server `arrayBuffer()` reads the
    // socket directly, where `request.body` builds a WHATWG Request, AbortSignal and
    // ReadableStream first — ~0.3 of the ~1.4 ms of server CPU a single submit took
    // (bench/README.md). Chunked bodies (no length) keep the streamed, limit-checked read.
    let buffer: ArrayBuffer;
    try {
      buffer = await request.arrayBuffer();
    } catch {
      throw new ContractError('invalid_input', 'the request body could not be read', {
        reason: 'body_unreadable',
      });
    }
    if (buffer.byteLength === 0) return EMPTY;
    if (!readable) throw unreadable(json);
    // Only a request built in memory can carry more bytes than it declares.
    if (buffer.byteLength > limit) throw payloadTooLarge(limit);
    return new Uint8Array(buffer);
  }
  const stream = request.body;
  if (stream === null) return EMPTY;
  const reader = stream.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  try {
    for (;;) {
      let next: Awaited<ReturnType<typeof reader.read>>;
      try {
        next = await reader.read();
      } catch {
        // The client broke off (or sent a malformed chunked body): nothing to decode.
        throw new ContractError('invalid_input', 'the request body could not be read', {
          reason: 'body_unreadable',
        });
      }
      if (next.done) break;
      const chunk = next.value;
      if (chunk.byteLength === 0) continue;
      // Checked at the first byte, so a large body of the wrong type is never read.
      if (!readable) throw unreadable(json);
      total += chunk.byteLength;
      if (total > limit) throw payloadTooLarge(limit);
      chunks.push(chunk);
    }
  } catch (error) {
    // Stop the producer: the rest of an oversized or unwanted body is never pulled.
    await reader.cancel().catch(() => undefined);
    throw error;
  } finally {
    reader.releaseLock();
  }
  return total === 0 ? EMPTY : concat(chunks, total);
}
