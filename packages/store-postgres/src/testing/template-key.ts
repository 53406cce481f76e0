/**
 * The `inject` key of the run's migrated template database, in a module without a vitest import
 * so the global setup (which runs outside test workers) can use it.
 */
declare module 'vitest' {
  export interface ProvidedContext {
    /** Name of the run's migrated template database (see `global-setup.ts`). */
    ledgenceTemplateDatabase: string;
  }
}

/** The `inject` key of the migrated template database's name. */
export const TEMPLATE_KEY = 'ledgenceTemplateDatabase';
