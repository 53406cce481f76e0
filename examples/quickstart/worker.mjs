// A worker: takes `greet` tasks from the `hello` queue and returns a greeting.
// Stop it with Ctrl-C: it finishes the tasks it holds, then exits.
import { ApplicationError, Worker } from '@ledgence/worker';

const worker = new Worker({
  url: process.env.LEDGENCE_URL ?? 'http://127.0.0.1:8080',
  apiKey: process.env.LEDGENCE_API_KEY, // absent: the server's development mode
  tenant: 'demo',
  namespace: 'default',
  queue: 'hello',
  concurrency: 4,
});

worker.register('greet', async (data, ctx) => {
  if (typeof data?.name !== 'string') {
    throw new ApplicationError('no_name', 'data.name must be a string', { retryable: false });
  }
  // Long work should watch ctx.signal: it aborts on cancellation, lease loss, the end of the
  // task's timeout_ms, or stop() once its grace is over.
  await new Promise((resolve) => setTimeout(resolve, 100));
  return { greeting: `Hello, ${data.name}!`, attempt: ctx.attempt };
});

for (const signal of ['SIGINT', 'SIGTERM']) {
  process.once(signal, () => void worker.stop({ graceMs: 10_000 }));
}
await worker.run();
