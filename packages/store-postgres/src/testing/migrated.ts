import { inject } from 'vitest';
import { createTestDatabase, type TestDatabase } from './database.js';
import { TEMPLATE_KEY } from './template-key.js';

/**
 * A database of its own with the store's schema already migrated: a copy of the template the
 * global setup migrated once per run.
 *
 * @param prefix a readable prefix for the database name (`[a-z0-9_]{1,24}`).
 */
export async function createMigratedTestDatabase(prefix?: string): Promise<TestDatabase> {
  const template: string = inject(TEMPLATE_KEY);
  return createTestDatabase(prefix === undefined ? { template } : { prefix, template });
}
