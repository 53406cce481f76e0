/**
 * The wave driver of the spec-questions probe (bench/README.md, "The two spec questions,
 * measured"): a 32-slot strict drain spoken over raw HTTP against a server built with
 * `prototype.patch`, so that the requests per wave are the only thing that changes.
 *
 *   mode 3: acquire:batch → renew:batch (dispatch; skipped for assignments granted at claim)
 *           → settle:batch, every wave.
 *   mode 2: acquire:batch once, then per wave [renew:batch] → proto-settle-acquire (the wave's
 *           settlements and the same slots' next polls in one request, two transactions).
 *   mode 1: the same through proto-settle-acquire-tx: one request and one transaction.
 *
 * Usage: node wave.mjs <server url> <mode 1|2|3> <tasks> <server pid>
 * Prints one JSON line: tasks/s from the first poll to the last settlement, requests per task,
 * and CPU ms per task of this process and of the server (from /proc).
 */
import { readFileSync } from 'node:fs';
import http from 'node:http';

const [url, mode, countText, serverPid] = process.argv.slice(2);
const count = Number(countText);
const SLOTS = 32;
const scope = { tenant_id: 'probe', namespace: 'waves' };
const queue = `wave-${Date.now()}`;
const agent = new http.Agent({ keepAlive: true, maxSockets: 4 });
const { hostname, port } = new URL(url);

/** POSTs a JSON text; resolves with the decoded reply, rejects on any status above 299. */
function post(path, text) {
  return new Promise((resolve, reject) => {
    const body = Buffer.from(text);
    const request = http.request(
      {
        host: hostname,
        port,
        path,
        method: 'POST',
        agent,
        headers: { 'content-type': 'application/json', 'content-length': body.length },
      },
      (response) => {
        const chunks = [];
        response.on('data', (chunk) => chunks.push(chunk));
        response.on('end', () => {
          const reply = Buffer.concat(chunks).toString();
          if (response.statusCode > 299)
            reject(new Error(`${path}: ${response.statusCode} ${reply}`));
          else resolve(JSON.parse(reply));
        });
      },
    );
    request.on('error', reject);
    request.end(body);
  });
}

/** User plus system CPU ms a process has used, from /proc (clock ticks of 10 ms). */
function cpuMs(pid) {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) * 10;
}

for (let from = 0; from < count; from += 1_000) {
  const commands = Array.from({ length: Math.min(1_000, count - from) }, (_, k) => ({
    idempotency_key: `${queue}-${from + k}`,
    input: { ...scope, queue, program: { name: 'noop' }, data: { i: from + k } },
  }));
  const path = `/v1/tenants/${scope.tenant_id}/namespaces/${scope.namespace}/tasks:batch`;
  const { results } = await post(path, JSON.stringify({ commands }));
  const refused = results.find((result) => result.task_id === undefined);
  if (refused !== undefined) throw new Error(`submit: ${JSON.stringify(refused)}`);
}
const session = await post(
  '/v1/worker/sessions',
  JSON.stringify({ scope, queue, concurrency: SLOTS }),
);
const sequences = new Array(SLOTS).fill(0);
function nextPolls() {
  const commands = sequences.map((last, consumer) => {
    sequences[consumer] = last + 1;
    return {
      scope,
      queue,
      worker_session_id: session.id,
      consumer_id: consumer,
      sequence: last + 1,
    };
  });
  return JSON.stringify({ commands });
}
function assignments(replies) {
  for (const reply of replies) {
    if (reply.disposition !== 'assigned' && reply.disposition !== 'empty') {
      throw new Error(`poll: ${JSON.stringify(reply)}`);
    }
  }
  return replies.filter((reply) => reply.disposition === 'assigned').map((r) => r.assignment);
}
function settlements(wave) {
  const now = Date.now();
  const commands = wave.map(({ lease: { owner } }) => ({
    owner,
    operation_id: `op-${owner.attempt_id}`,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output: null },
        started_at: now,
        finished_at: now,
      },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  }));
  return JSON.stringify({ commands });
}
function requireSucceeded(results) {
  const refused = results.find((result) => result.task_state !== 'succeeded');
  if (refused !== undefined) throw new Error(`settle: ${JSON.stringify(refused)}`);
}

let done = 0;
let requests = 0;
const ownCpu = process.cpuUsage();
const serverCpu = cpuMs(serverPid);
const started = performance.now();
/** The next poll of every slot, as one long-polling acquire:batch. */
async function poll() {
  requests += 1;
  return assignments((await post('/v1/worker/acquire:batch?wait_ms=1000', nextPolls())).replies);
}
let wave = await poll();
while (done < count) {
  if (wave.length === 0) {
    // Nothing was claimed by the last request (possible in mode 1, which never waits): poll again.
    wave = await poll();
    continue;
  }
  const undispatched = wave.filter((assignment) => !assignment.authority.dispatch_allowed);
  if (undispatched.length > 0) {
    const commands = undispatched.map((a) => ({
      owner: a.lease.owner,
      sequence: 1,
      intent: 'dispatch',
    }));
    const { results } = await post('/v1/worker/renew:batch', JSON.stringify({ commands }));
    requests += 1;
    if (results.some((authority) => authority.dispatch_allowed !== true)) {
      throw new Error(`dispatch refused: ${JSON.stringify(results)}`);
    }
  }
  done += wave.length;
  if (mode === '3') {
    requireSucceeded((await post('/v1/worker/settle:batch', settlements(wave))).results);
    requests += 1;
    if (done >= count) break;
    wave = await poll();
  } else {
    const waitMs = done >= count ? 0 : 1_000;
    const body = `${settlements(wave)}\n${nextPolls()}`;
    const route =
      mode === '1' ? 'proto-settle-acquire-tx' : `proto-settle-acquire?wait_ms=${waitMs}`;
    const reply = await post(`/v1/worker/${route}`, body);
    requests += 1;
    requireSucceeded(reply.results);
    wave = assignments(reply.replies);
  }
}
const seconds = (performance.now() - started) / 1_000;
const own = process.cpuUsage(ownCpu);
console.log(
  JSON.stringify({
    mode: Number(mode),
    tasks_per_s: Math.round(done / seconds),
    requests_per_task: Number((requests / done).toFixed(3)),
    driver_cpu_ms_per_task: Number(((own.user + own.system) / 1_000 / done).toFixed(3)),
    server_cpu_ms_per_task: Number(((cpuMs(serverPid) - serverCpu) / done).toFixed(3)),
  }),
);
agent.destroy();
