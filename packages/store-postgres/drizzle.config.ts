/**
 * drizzle-kit configuration: `npx drizzle-kit generate --name <what>` (from this folder) writes a
 * new migration into `drizzle/` from `src/schema.ts`. Review the SQL, re-apply the hand-edits
 * described at the top of `drizzle/0000_init.sql` where they apply, and commit it.
 *
 * A plain object rather than drizzle-kit's `defineConfig`: drizzle-kit is a dev-only tool, and
 * non-test files of a package may import only its runtime dependencies (scripts/check-deps.mjs).
 */
export default {
  dialect: 'postgresql',
  schema: './src/schema.ts',
  out: './drizzle',
};
