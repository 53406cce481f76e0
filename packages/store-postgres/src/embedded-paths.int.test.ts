/**
 * Odd data folder paths (review r49a; `dataFolder` in embedded.ts): a path that is a file, a
 * symlink to an empty folder, a dangling symlink, a path below a file, and (as root) a symlink to
 * a cluster whose folder is root's.
 */
import { existsSync } from 'node:fs';
import {
  chmod,
  chown,
  cp,
  lstat,
  mkdir,
  mkdtemp,
  readdir,
  readFile,
  readlink,
  rm,
  stat,
  symlink,
  writeFile,
} from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type EmbeddedPostgres, EmbeddedPostgresError, startEmbeddedPostgres } from './embedded.js';

let base: string;
const running: EmbeddedPostgres[] = [];

beforeAll(async () => {
  base = await mkdtemp(join(tmpdir(), 'ledgence-paths-'));
  await chmod(base, 0o755);
});

afterAll(async () => {
  await Promise.all(running.map((server) => server.stop()));
  await rm(base, { recursive: true, force: true });
});

async function start(dataDir: string): Promise<EmbeddedPostgres> {
  const server = await startEmbeddedPostgres({ dataDir, durability: 'fast' });
  running.push(server);
  return server;
}

async function selectOne(url: string): Promise<number | undefined> {
  const sql = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 10 });
  try {
    const [row] = await sql<{ one: number }[]>`select 1 as one`;
    return row?.one;
  } finally {
    await sql.end();
  }
}

describe('a data folder path that is not a plain folder', () => {
  it('a regular file: refused with an EmbeddedPostgresError (JSDoc @throws), the file kept, no staging left', async () => {
    const dir = join(base, 'file-case');
    await mkdir(dir);
    await chmod(dir, 0o755);
    const file = join(dir, 'pg');
    await writeFile(file, 'mine');
    const error = await startEmbeddedPostgres({ dataDir: file, durability: 'fast' }).catch(
      (e: unknown) => e,
    );
    expect(await readFile(file, 'utf8')).toBe('mine');
    expect(await readdir(dir)).toEqual(['pg']);
    expect({
      isEmbeddedError: error instanceof EmbeddedPostgresError,
      message: String((error as Error)?.message),
    }).toEqual({ isEmbeddedError: true, message: expect.any(String) });
  }, 60_000);

  it('a symlink to an empty folder: the cluster is made in the folder it points to, the link kept', async () => {
    const dir = join(base, 'link-case');
    await mkdir(dir);
    await chmod(dir, 0o755);
    const target = join(dir, 'real');
    await mkdir(target);
    await chmod(target, 0o700);
    if (process.getuid?.() === 0) {
      const postgresUid = Number(
        (await readFile('/etc/passwd', 'utf8')).match(/^postgres:[^:]*:(\d+):(\d+):/m)?.[1] ?? NaN,
      );
      const postgresGid = Number(
        (await readFile('/etc/passwd', 'utf8')).match(/^postgres:[^:]*:(\d+):(\d+):/m)?.[2] ?? NaN,
      );
      if (Number.isInteger(postgresUid)) await chown(target, postgresUid, postgresGid);
    }
    const link = join(dir, 'pg');
    await symlink(target, link);
    const server = await start(link);
    expect(await selectOne(server.url)).toBe(1);
    await server.stop();
    const linkStat = await lstat(link);
    expect({
      stillALink: linkStat.isSymbolicLink(),
      clusterInTarget: existsSync(join(target, 'PG_VERSION')),
    }).toEqual({ stillALink: true, clusterInTarget: true });
  }, 120_000);

  it('a dangling symlink: a cluster made at its target, or an EmbeddedPostgresError — not a raw ENOTDIR after a wasted initdb; the link kept', async () => {
    const dir = join(base, 'dangling-case');
    await mkdir(dir);
    await chmod(dir, 0o755);
    const target = join(dir, 'not-mounted', 'pgdata');
    const link = join(dir, 'pg');
    await symlink(target, link);
    const outcome = await start(link).then(
      async (server) => {
        await server.stop();
        return 'started';
      },
      (e: unknown) => `refused: ${(e as Error).message}`,
    );
    // Either the cluster is where the link points, or the start is refused; the link stays.
    const linkStat = await lstat(link);
    expect({
      outcome,
      stillALink: linkStat.isSymbolicLink(),
      to: await readlink(link).catch(() => null),
    }).toEqual({
      outcome: expect.stringMatching(/^started$|^refused: (?!ENOTDIR)/),
      stillALink: true,
      to: target,
    });
  }, 120_000);

  it('a path below a regular file: an EmbeddedPostgresError naming the path, not a raw ENOTDIR; the file kept', async () => {
    const dir = join(base, 'below-file-case');
    await mkdir(dir);
    await chmod(dir, 0o755);
    const file = join(dir, 'backup.tar');
    await writeFile(file, 'mine');
    const dataDir = join(file, 'pgdata');
    const error = await startEmbeddedPostgres({ dataDir, durability: 'fast' }).catch(
      (e: unknown) => e,
    );
    expect({
      isEmbeddedError: error instanceof EmbeddedPostgresError,
      code: (error as EmbeddedPostgresError).code,
      namesThePath: String((error as Error).message).includes(dataDir),
      fileKept: await readFile(file, 'utf8'),
    }).toEqual({
      isEmbeddedError: true,
      code: 'data_dir_invalid',
      namesThePath: true,
      fileKept: 'mine',
    });
  }, 60_000);

  it.runIf(process.getuid?.() === 0)(
    "as root, a symlink to an initialised cluster whose folder is root's (restored as root): handed to the server user and served (takeOwnership)",
    async () => {
      const dir = join(base, 'root-link-case');
      await mkdir(dir);
      await chmod(dir, 0o755);
      const plain = join(dir, 'plain');
      const first = await start(plain);
      await first.stop();
      const target = join(dir, 'restored');
      await cp(plain, target, { recursive: true, preserveTimestamps: true });
      // Restored as root: every file root's, as a copy by root makes them.
      const owned = async (path: string): Promise<void> => {
        await chown(path, 0, 0);
        const info = await lstat(path);
        if (info.isDirectory())
          for (const name of await readdir(path)) await owned(join(path, name));
      };
      await owned(target);
      await chmod(target, 0o700);
      const link = join(dir, 'pg');
      await symlink(target, link);
      const outcome = await start(link).then(
        async (server) => {
          const one = await selectOne(server.url);
          await server.stop();
          return `served ${one}`;
        },
        (e: unknown) => `refused: ${(e as Error).message}`,
      );
      expect({
        outcome,
        targetUid: (await stat(target)).uid === 0 ? 'root' : 'server user',
      }).toEqual({
        outcome: 'served 1',
        targetUid: 'server user',
      });
    },
    120_000,
  );

  it.runIf(process.getuid?.() === 0)(
    'control: as root, the same root-owned restored cluster named by its own path is handed over and served',
    async () => {
      const dir = join(base, 'root-plain-case');
      await mkdir(dir);
      await chmod(dir, 0o755);
      const plain = join(dir, 'plain');
      const first = await start(plain);
      await first.stop();
      const target = join(dir, 'restored');
      await cp(plain, target, { recursive: true, preserveTimestamps: true });
      const owned = async (path: string): Promise<void> => {
        await chown(path, 0, 0);
        const info = await lstat(path);
        if (info.isDirectory())
          for (const name of await readdir(path)) await owned(join(path, name));
      };
      await owned(target);
      await chmod(target, 0o700);
      const server = await start(target);
      expect(await selectOne(server.url)).toBe(1);
      await server.stop();
      expect((await stat(target)).uid).not.toBe(0);
    },
    120_000,
  );
});
