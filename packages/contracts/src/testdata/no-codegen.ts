/**
 * Run by compile.test.ts under `node --disallow-code-generation-from-strings`: prints how
 * `parseWith` answers when no schema can be compiled.
 */
import * as v from 'valibot';
import { compileSchema } from '../compile.js';
import { parseWith } from '../decode.js';
import { NameSchema } from '../schemas/index.js';

const schema = v.strictObject({ queue: NameSchema, consumer_id: v.number() });
let rejected = '';
try {
  parseWith(schema, { queue: ' email', consumer_id: 3 });
} catch (error) {
  rejected = (error as Error).message;
}
process.stdout.write(
  JSON.stringify({
    compiled: compileSchema(schema) !== undefined,
    accepted: parseWith(schema, { queue: 'email', consumer_id: 3 }),
    rejected,
  }),
);
