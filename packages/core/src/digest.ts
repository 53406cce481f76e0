import { createHash } from 'node:crypto';
import { canonicalJson } from '@ledgence/contracts';

/**
 * SHA-256 (hex) of a command's canonical JSON. Replays compare digests: the
 * same identity with the same canonical bytes is a replay, with other bytes a
 * conflict (DESIGN §1.3), and a store keeps 64 characters instead of a copy.
 *
 * Submits and settlements no longer record one (see {@link isRecordedCommand});
 * it remains for rows earlier versions recorded with a digest.
 */
export function commandDigest(command: unknown): string {
  return createHash('sha256').update(canonicalJson(command)).digest('hex');
}

/**
 * Whether `command` is the command a row recorded, canonically (DESIGN §1.3: the same identity
 * with the same canonical command replays; with another, it conflicts). `recorded` is the
 * command as rebuilt from the row. The comparison runs only when a command's identity is seen a
 * second time, so a first submit or settle computes nothing: the digest they used to record was
 * ~11 % of the server's CPU in a bulk submit and ~8 % in a drain (bench/README.md, "Settle
 * digests on replay only" and "Submit digests on replay only"). A row recorded with a digest,
 * by an earlier version, is compared by it.
 */
export function isRecordedCommand(
  recorded: unknown,
  recordedDigest: string | null,
  command: unknown,
): boolean {
  if (recordedDigest !== null) return recordedDigest === commandDigest(command);
  return canonicalJson(recorded) === canonicalJson(command);
}
