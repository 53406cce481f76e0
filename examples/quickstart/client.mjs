// A client: submits three `greet` tasks and waits for their results.
import { Client } from '@ledgence/worker';

const client = new Client({
  url: process.env.LEDGENCE_URL ?? 'http://127.0.0.1:8080',
  apiKey: process.env.LEDGENCE_API_KEY,
  tenant: 'demo',
  namespace: 'default',
});

const names = process.argv.slice(2);
for (const name of names.length > 0 ? names : ['Ada', 'Grace', 'Edsger']) {
  // The idempotency key makes a re-run return the same task instead of a new one.
  const task = await client.submit(
    { queue: 'hello', program: 'greet', data: { name } },
    { idempotencyKey: `greet-${name}` },
  );
  const { outcome } = await client.result(task.task_id, { waitMs: 20_000 });
  console.log(task.task_id, JSON.stringify(outcome));
}
