/**
 * The Standard Schema v1 interface (https://standardschema.dev), copied as
 * the spec invites, so the SDK accepts valibot, zod or arktype schemas
 * without depending on any of them (or on `@standard-schema/spec`) at
 * runtime: `@ledgence/worker` depends on `@ledgence/contracts` only.
 */

/** A schema implementing Standard Schema v1. */
export interface StandardSchemaV1<Input = unknown, Output = Input> {
  /** The Standard Schema properties. */
  readonly '~standard': StandardSchemaV1.Props<Input, Output>;
}

/** Types of the Standard Schema v1 interface. */
export declare namespace StandardSchemaV1 {
  /** The Standard Schema properties interface. */
  export interface Props<Input = unknown, Output = Input> {
    readonly version: 1;
    readonly vendor: string;
    readonly validate: (value: unknown) => Result<Output> | Promise<Result<Output>>;
    readonly types?: Types<Input, Output> | undefined;
  }
  /** The result of validation. */
  export type Result<Output> = SuccessResult<Output> | FailureResult;
  /** A successful validation. */
  export interface SuccessResult<Output> {
    readonly value: Output;
    readonly issues?: undefined;
  }
  /** A failed validation. */
  export interface FailureResult {
    readonly issues: ReadonlyArray<Issue>;
  }
  /** One validation issue. */
  export interface Issue {
    readonly message: string;
    readonly path?: ReadonlyArray<PropertyKey | PathSegment> | undefined;
  }
  /** A path segment of an issue. */
  export interface PathSegment {
    readonly key: PropertyKey;
  }
  /** The input and output types of a schema. */
  export interface Types<Input = unknown, Output = Input> {
    readonly input: Input;
    readonly output: Output;
  }
  /** The input type of a schema. */
  export type InferInput<Schema extends StandardSchemaV1> = NonNullable<
    Schema['~standard']['types']
  >['input'];
  /** The output type of a schema. */
  export type InferOutput<Schema extends StandardSchemaV1> = NonNullable<
    Schema['~standard']['types']
  >['output'];
}

/** An issue's path as `$.a.b[0]`-style text for an error message. */
export function issuePath(issue: StandardSchemaV1.Issue): string {
  let path = '$';
  for (const segment of issue.path ?? []) {
    const key = typeof segment === 'object' && segment !== null ? segment.key : segment;
    path += typeof key === 'number' ? `[${key}]` : `.${String(key)}`;
  }
  return path;
}
