/**
 * The documentation taken literally by a new user. Each test runs a snippet or a
 * claim of README.md / packages/worker/README.md as written, against a real server process on
 * a real PostgreSQL, through the real SDK (or curl and bash, as the README pastes them).
 */
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ContractError } from '@ledgence/contracts';
import { Client, ProblemError, silentLogger, type Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { NAMESPACE, Stack, shortWorker, sleep, TENANT } from './test/harness.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const readme = readFileSync(join(root, 'README.md'), 'utf8');
const workerReadme = readFileSync(join(root, 'packages', 'worker', 'README.md'), 'utf8');

/** The first fenced block of `lang` after `marker` in `text`, as written. */
function blockAfter(text: string, marker: string, lang: string): string {
  const at = text.indexOf(marker);
  if (at < 0) throw new Error(`marker not found: ${marker}`);
  const open = text.indexOf(`\`\`\`${lang}\n`, at);
  const close = text.indexOf('\n```', open + 4);
  return text.slice(open + lang.length + 4, close + 1);
}

function bash(
  script: string,
  timeoutMs: number,
): Promise<{ code: number; out: string; err: string }> {
  return new Promise((resolve) => {
    execFile('bash', ['-c', script], { timeout: timeoutMs }, (error, out, err) => {
      const code = error === null ? 0 : typeof error.code === 'number' ? error.code : -1;
      resolve({ code, out, err });
    });
  });
}

const stack = new Stack('readme_literal');
const workers: Worker[] = [];
beforeAll(async () => {
  await stack.open();
});
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
});
afterAll(async () => {
  await stack.close();
});

describe('README "The protocol with curl", pasted into bash as written', () => {
  it('prints true, succeeded and the succeeded result; pasted again it submits nothing new and prints the same result', async () => {
    // The README's own long-poll maximum (the default): its step 3 asks for 5 s.
    const server = await stack.start({ LEDGENCE_LONG_POLL_WAIT_MS: '20000' });
    const block = blockAfter(readme, '### The protocol with curl', 'sh');
    expect(block).toContain('L=http://127.0.0.1:8080\n');
    const script = block.replace(
      'L=http://127.0.0.1:8080\n',
      `L=${server.url.replace(/\/$/, '')}\n`,
    );

    const first = await bash(script, 60_000);
    const lines = first.out.trim().split('\n');
    expect(lines.slice(0, 2), first.err).toEqual(['true', 'succeeded']);
    const result = JSON.parse(lines[2] ?? 'null') as {
      status: { state: string; queue: string; attempt_count: number };
      outcome: unknown;
    };
    expect(result.outcome).toEqual({ state: 'succeeded', output: { sent: true } });
    expect(result.status).toMatchObject({ state: 'succeeded', queue: 'email', attempt_count: 1 });

    // "pasting the whole block again submits nothing new: step 1 answers the task already
    // succeeded, step 3's acquire waits its 5 s and answers {"disposition":"empty"}"
    const started = Date.now();
    const second = await bash(script, 60_000);
    expect(Date.now() - started).toBeGreaterThanOrEqual(4_500);
    expect(second.out.trim().split('\n').at(-1)).toBe(lines[2]);
    expect(second.err).toContain('Cannot read properties of undefined');
    const listing = new Client({
      url: server.url,
      tenant: 'acme',
      namespace: 'dev',
      logger: silentLogger,
    });
    let tasks = 0;
    for await (const page of listing.list({})) tasks += page.tasks.length;
    expect(tasks).toBe(1);
  });
});

describe('packages/worker/README.md "to wait longer, loop:"', () => {
  it('the loop as written waits past the server long-poll maximum until the task is terminal', async () => {
    // A server whose long-poll maximum is shorter than the handler, as 20 s is for longer work.
    const server = await stack.start({ LEDGENCE_LONG_POLL_WAIT_MS: '300' });
    const worker = shortWorker(server.url, 'loop');
    workers.push(worker);
    worker.register('slow', async () => {
      await sleep(1_500);
      return { done: true };
    });
    void worker.run();
    const client = new Client({
      url: server.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      logger: silentLogger,
    });
    const task = await client.submit({ queue: 'loop', program: 'slow' });

    const snippet = blockAfter(workerReadme, 'to wait longer, loop:', 'ts');
    expect(snippet).toContain('client.result(task.task_id, { waitMs: Infinity })');
    // The two lines as a user pastes them (valid JavaScript as well as TypeScript).
    const AsyncFunction = Object.getPrototypeOf(async () => {}).constructor as new (
      ...args: string[]
    ) => (client: Client, task: { task_id: string }) => Promise<{ outcome: { state: string } }>;
    const run = new AsyncFunction('client', 'task', `${snippet}\nreturn result;`);
    const result = await run(client, task);
    // A loop on `result.state`, which a TaskResult does not have ({status, outcome}), would never
    // loop, and the task would come back still pending after 300 ms.
    expect(result.outcome.state).toBe('succeeded');
  });
});

describe('the SDK error classes as documented (packages/worker/README.md, "Errors:")', () => {
  it('a submit refused by the local validation rejects with a ProblemError, as the server refusal and the submitBatch slot of the same entry do', async () => {
    const server = await stack.start();
    const client = new Client({
      url: server.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      logger: silentLogger,
    });
    // The server's refusal of a bad timeout (it alone knows its margin): a ProblemError.
    const byServer = await client
      .submit({ queue: 'errors', program: 'p', timeout_ms: 5_499 })
      .catch((e: unknown) => e);
    expect(byServer).toBeInstanceOf(ProblemError);
    expect(byServer).toMatchObject({ code: 'invalid_input', status: 400 });
    // The same kind of mistake caught by the SDK in a batch: a ProblemError in its slot.
    const [inBatch] = await client.submitBatch([{ queue: 'errors', program: 'p', priority: 101 }]);
    expect(inBatch).toBeInstanceOf(ProblemError);
    // The same entry alone: the README lists TransportError, ProtocolError, ProblemError,
    // ApplicationError, TaskAbortedError and TypeError; @ledgence/worker exports no ContractError.
    const alone = await client
      .submit({ queue: 'errors', program: 'p', priority: 101 })
      .catch((e: unknown) => e);
    expect(alone).toBeInstanceOf(ContractError); // ProblemError is one
    expect(alone).toMatchObject({ code: 'invalid_input', path: '$.input.priority' });
    expect(alone).toBeInstanceOf(ProblemError);
  });
});

/**
 * A reverse proxy that serves the server under `/ledgence` (as an operator mounts it behind a
 * gateway), stripping the prefix; anything else is the proxy's own 404.
 */
async function prefixProxy(
  target: string,
  prefix: string,
): Promise<{ url: string; close(): Promise<void>; paths: string[] }> {
  const { createServer, request } = await import('node:http');
  const paths: string[] = [];
  const upstream = new URL(target);
  const server = createServer((req, res) => {
    const path = req.url ?? '/';
    paths.push(path);
    if (!path.startsWith(`${prefix}/`)) {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not behind the prefix');
      return;
    }
    const forward = request(
      {
        host: upstream.hostname,
        port: upstream.port,
        method: req.method,
        path: path.slice(prefix.length),
        headers: { ...req.headers, host: upstream.host },
      },
      (reply) => {
        res.writeHead(reply.statusCode ?? 502, reply.headers);
        reply.pipe(res);
      },
    );
    forward.on('error', () => res.destroy());
    req.pipe(forward);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as import('node:net').AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    paths,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

describe('packages/worker/README.md: "url is the server\'s base URL, optionally with a path prefix"', () => {
  it('a Client and a Worker behind a gateway at /ledgence (with and without a trailing slash) run a task end to end', async () => {
    const server = await stack.start();
    const proxy = await prefixProxy(server.url, '/ledgence');
    try {
      const worker = shortWorker(`${proxy.url}/ledgence/`, 'prefix', { concurrency: 2 });
      workers.push(worker);
      worker.register('echo', (data, ctx) => ({ data, attempt: ctx.attempt }));
      void worker.run();
      const client = new Client({
        url: `${proxy.url}/ledgence`,
        tenant: TENANT,
        namespace: NAMESPACE,
        logger: silentLogger,
      });
      const task = await client.submit({ queue: 'prefix', program: 'echo', data: { n: 1 } });
      let result = await client.result(task.task_id, { waitMs: 1_000 });
      for (let i = 0; i < 30 && result.outcome.state === 'pending'; i++) {
        result = await client.result(task.task_id, { waitMs: 1_000 });
      }
      expect(result.outcome).toEqual({
        state: 'succeeded',
        output: { data: { n: 1 }, attempt: 1 },
      });
      const pages: unknown[] = [];
      for await (const page of client.history(task.task_id)) pages.push(...page);
      expect(pages.length).toBeGreaterThan(0);
      expect(await client.cancel(task.task_id)).toBe('succeeded');
      // Every request went through the prefix, none to the gateway's root.
      expect(proxy.paths.filter((p) => !p.startsWith('/ledgence/v1/'))).toEqual([]);
    } finally {
      await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
      await proxy.close();
    }
  });
});

describe('README "Completion callbacks", its destination and its curl subscribe as written', () => {
  it('subscribes the walkthrough task (201, then 200 on a repeat) and the receiver gets one signed CloudEvent naming it', async () => {
    const { createServer } = await import('node:http');
    const { createHmac } = await import('node:crypto');
    const received: { headers: Record<string, string | string[] | undefined>; body: string }[] = [];
    const receiver = createServer((req, res) => {
      let body = '';
      req.setEncoding('utf8');
      req.on('data', (chunk: string) => {
        body += chunk;
      });
      req.on('end', () => {
        received.push({ headers: req.headers, body });
        res.writeHead(204).end();
      });
    });
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    const port = (receiver.address() as import('node:net').AddressInfo).port;
    try {
      const block = blockAfter(readme, '## Completion callbacks', 'sh');
      const exported = /^export LEDGENCE_CALLBACK_DESTINATIONS='(.*)'$/m.exec(block)?.[1];
      expect(exported).toBeDefined();
      const destinations = (exported as string).replace(
        'http://127.0.0.1:9000',
        `http://127.0.0.1:${port}`,
      );
      const secret = (JSON.parse(exported as string) as { billing: { secret: string } }).billing
        .secret;
      const server = await stack.start({ LEDGENCE_CALLBACK_DESTINATIONS: destinations });

      const walkthrough = blockAfter(readme, '### The protocol with curl', 'sh')
        .replace('L=http://127.0.0.1:8080\n', `L=${server.url.replace(/\/$/, '')}\n`)
        .replace('welcome-1', 'welcome-callbacks');
      const subscribe = block.slice(
        block.indexOf('curl -s -X POST "$S/tasks/$TASK/completion-subscriptions"'),
      );
      const status = subscribe.replace(
        'curl -s -X POST',
        "curl -s -o /dev/null -w '%{http_code}\\n' -X POST",
      );
      const run = await bash(`${walkthrough}\necho\n${status}\n${status}`, 60_000);
      const lines = run.out.trim().split('\n');
      expect(lines.slice(-2), run.err).toEqual(['201', '200']);
      const taskId = (JSON.parse(lines[2] ?? 'null') as { status: { task_id: string } }).status
        .task_id;

      const end = Date.now() + 20_000;
      while (received.length === 0 && Date.now() < end) await sleep(50);
      await sleep(500); // a second delivery would show now
      expect(received).toHaveLength(1);
      const [delivery] = received;
      const h = delivery?.headers ?? {};
      expect(h['content-type']).toBe('application/cloudevents+json');
      const event = JSON.parse(delivery?.body ?? '{}') as {
        id: string;
        type: string;
        subject: string;
        data: { task_id: string; state: string };
      };
      expect(event).toMatchObject({
        type: 'dev.ledgence.task.completed',
        subject: taskId,
        data: { task_id: taskId, state: 'succeeded' },
      });
      expect(h['webhook-id']).toBe(event.id);
      const key = Buffer.from(secret.slice('whsec_'.length), 'base64');
      const expected = createHmac('sha256', key)
        .update(`${h['webhook-id']}.${h['webhook-timestamp']}.${delivery?.body}`)
        .digest('base64');
      expect(h['webhook-signature']).toBe(`v1,${expected}`);
    } finally {
      receiver.closeAllConnections();
      await new Promise<void>((resolve) => receiver.close(() => resolve()));
    }
  });
});

describe('README quick start: the examples "also read LEDGENCE_API_KEY"', () => {
  it('worker.mjs and client.mjs run against a server with API keys given LEDGENCE_URL and LEDGENCE_API_KEY; a re-run returns the same tasks', async () => {
    const { spawn } = await import('node:child_process');
    const key = 'r38b0123456789abcdef0123456789abcdef';
    const server = await stack.start({
      LEDGENCE_API_KEYS: JSON.stringify([
        { key, tenant: 'demo', namespaces: ['*'], roles: ['client', 'worker'] },
      ]),
    });
    const env = {
      ...process.env,
      LEDGENCE_URL: server.url.replace(/\/$/, ''),
      LEDGENCE_API_KEY: key,
    };
    const examples = join(root, 'examples', 'quickstart');
    const worker = spawn(process.execPath, [join(examples, 'worker.mjs')], {
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let workerOutput = '';
    worker.stdout?.on('data', (c: Buffer) => {
      workerOutput += c.toString();
    });
    worker.stderr?.on('data', (c: Buffer) => {
      workerOutput += c.toString();
    });
    const exited = new Promise<number | string>((resolve) =>
      worker.once('exit', (code, signal) => resolve(code ?? signal ?? -1)),
    );
    try {
      const client = () =>
        new Promise<{ code: number; out: string; err: string }>((resolve) => {
          execFile(
            process.execPath,
            [join(examples, 'client.mjs')],
            { env, timeout: 60_000 },
            (error, out, err) =>
              resolve({ code: error === null ? 0 : Number(error.code ?? -1), out, err }),
          );
        });
      const first = await client();
      expect(first.code, `${first.err}\n${workerOutput}`).toBe(0);
      const lines = first.out.trim().split('\n');
      expect(lines).toHaveLength(3);
      for (const [i, name] of ['Ada', 'Grace', 'Edsger'].entries()) {
        expect(lines[i]).toMatch(/^tsk_\S+ /);
        expect(JSON.parse((lines[i] ?? '').replace(/^\S+ /, ''))).toEqual({
          state: 'succeeded',
          output: { greeting: `Hello, ${name}!`, attempt: 1 },
        });
      }
      const second = await client();
      expect(second.out).toBe(first.out); // the idempotency keys: the same tasks, the same outcomes
    } finally {
      worker.kill('SIGTERM'); // `kill %1`: "the worker finishes what it holds, then exits"
    }
    expect(await exited).toBe(0);
    expect(workerOutput).toBe('');
  });
});

describe('README "Strict input": application JSON nests 64, a whole command 72', () => {
  it('a body of 10 MiB of [ sent to the server is rejected at depth 73, as the README says', async () => {
    const server = await stack.start();
    const reply = await fetch(
      `${server.url.replace(/\/$/, '')}/v1/tenants/${TENANT}/namespaces/${NAMESPACE}/tasks:batch`,
      {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '['.repeat(10 * 1024 * 1024),
      },
    );
    const problem = (await reply.json()) as { code: string; reason: string; detail: string };
    expect([reply.status, problem.code, problem.reason]).toEqual([
      400,
      'invalid_input',
      'depth_exceeded',
    ]);
    // A command's limit is COMMAND_MAX_DEPTH (JSON_MAX_DEPTH 64 for application JSON + 8 for the
    // envelope); only `data`, `output` and `details` are held to 64.
    expect(problem.detail).toMatch(/^nesting deeper than 72 levels/);
  });
});
