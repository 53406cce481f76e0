/**
 * Append-only JSONL logs. Every process of a chaos run (submitter, workers, receiver, fault
 * injector) appends what it saw to its own file, and the checker reads them back after the run:
 * what a client was told is the evidence the database is judged against.
 */
import { appendFileSync, existsSync, readFileSync } from 'node:fs';

/** One JSONL file, appended to synchronously. */
export class JsonlLog {
  /** @param path the file; created on the first append. */
  constructor(readonly path: string) {}

  /**
   * Appends one record as one line. Synchronous on purpose: the line is in the kernel before the
   * caller goes on, so a SIGKILL right after cannot lose it (one small `write` is not torn).
   */
  append(record: object): void {
    appendFileSync(this.path, `${JSON.stringify(record)}\n`);
  }
}

/**
 * Reads a JSONL file (missing: no records). A final line cut short by a kill is skipped; any
 * other unreadable line is an error, since it means a log that cannot be trusted.
 */
export function readJsonl<T>(path: string): T[] {
  if (!existsSync(path)) return [];
  const lines = readFileSync(path, 'utf8').split('\n');
  const records: T[] = [];
  lines.forEach((line, index) => {
    if (line.trim() === '') return;
    try {
      records.push(JSON.parse(line) as T);
    } catch (error) {
      if (index < lines.length - 1 && lines.slice(index + 1).some((l) => l.trim() !== '')) {
        throw new Error(`${path}:${index + 1} is not JSON`, { cause: error });
      }
    }
  });
  return records;
}
