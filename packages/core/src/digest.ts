import { createHash } from 'node:crypto';
import { canonicalJson } from '@ledgence/contracts';

/**
 * SHA-256 (hex) of a command's canonical JSON. Replays compare digests: the
 * same identity with the same canonical bytes is a replay, with other bytes a
 * conflict (DESIGN §1.3), and a store keeps 64 characters instead of a copy.
 */
export function commandDigest(command: unknown): string {
  return createHash('sha256').update(canonicalJson(command)).digest('hex');
}
