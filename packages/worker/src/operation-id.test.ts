/**
 * The SDK's side of OPERATION_ID_MAX_BYTES at its edge. `settle:<attempt_id>` is used
 * as it is up to exactly the limit (counted in UTF-8 bytes), and hashed one byte beyond it.
 */
import { OPERATION_ID_MAX_BYTES, utf8ByteLength } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { operationIdFor } from './settle.js';

const PREFIX = 'settle:';

describe('operationIdFor at OPERATION_ID_MAX_BYTES', () => {
  it('keeps an id of exactly the limit and hashes one byte more', () => {
    const fits = 'a'.repeat(OPERATION_ID_MAX_BYTES - PREFIX.length);
    expect(operationIdFor(fits)).toBe(`${PREFIX}${fits}`);
    expect(utf8ByteLength(operationIdFor(fits))).toBe(OPERATION_ID_MAX_BYTES);
    const over = `${fits}a`;
    expect(operationIdFor(over)).toMatch(/^settle:sha256:[0-9a-f]{64}$/);
  });

  it('counts UTF-8 bytes, not UTF-16 units', () => {
    // 60 two-byte characters + 1 = 121 bytes: with the prefix exactly the limit.
    const fits = `${'é'.repeat(60)}a`;
    expect(utf8ByteLength(`${PREFIX}${fits}`)).toBe(OPERATION_ID_MAX_BYTES);
    expect(operationIdFor(fits)).toBe(`${PREFIX}${fits}`);
    // One more two-byte character: 129 bytes although only 69 UTF-16 units.
    const over = `${'é'.repeat(61)}`;
    expect(utf8ByteLength(`${PREFIX}${over}`)).toBe(OPERATION_ID_MAX_BYTES + 1);
    expect(operationIdFor(over)).toMatch(/^settle:sha256:/);
  });
});
