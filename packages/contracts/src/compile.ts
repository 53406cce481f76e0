/**
 * The wire schemas compiled into JavaScript, for the accepting path of
 * {@link parseWith}: every command the server decodes and every reply and
 * command the SDK checks goes through a schema, and valibot's interpreter
 * spent half of that time on its own bookkeeping — a dataset object per field,
 * the pipe loop, and property accesses shared by every object schema, which
 * the engine cannot specialise (bench/README.md, "Wire schemas compiled for
 * the accepting path").
 *
 * A compiled schema answers only "valid, and this is valibot's output" or
 * {@link REJECTED}; it never explains a rejection. `parseWith` asks valibot
 * again for every rejected value, so every error a caller sees — code, path,
 * message — is valibot's own. The compiled function must therefore agree with
 * valibot in both directions (a rejection valibot would not make would change
 * which option a union takes), and on success return an output equal to
 * valibot's, key order included. compile.test.ts checks both over generated
 * values for every exported schema.
 *
 * Each schema and action kind the contracts use is recognised by its valibot
 * factory (`reference`) and emitted as the code its `~run` performs (valibot
 * 1.5). Any other node — a kind added later, a custom `~run` — is run by
 * valibot itself inside the compiled code: exact by construction, only
 * slower. Where the runtime refuses code generation (a content security
 * policy, some edge runtimes), {@link compileSchema} returns `undefined` and
 * valibot parses everything, as before.
 *
 * The generated code is built from the schemas alone (keys and literals
 * written as JSON strings, every function and non-JSON value passed in as a
 * constant), never from a value being checked.
 */
import * as v from 'valibot';

/** What a compiled schema returns for a value valibot would reject. */
export const REJECTED: unique symbol = Symbol('rejected');

/** A schema compiled by {@link compileSchema}: valibot's output, or {@link REJECTED}. */
export type CompiledSchema = (value: unknown) => unknown;

type Node = { kind: string; type: string; reference: unknown } & Record<string, unknown>;
type Dataset = { typed?: boolean; value: unknown; issues?: unknown[] };
type Runnable = { '~run': (dataset: Dataset, config: v.Config<v.BaseIssue<unknown>>) => Dataset };

// `parseWith`'s configuration: the first issue ends a run. Only delegated nodes see it.
const CONFIG = v.getGlobalConfig({ abortEarly: true });

const compiledSchemas = new WeakMap<object, CompiledSchema | null>();
let codeGeneration: boolean | undefined;

/** Thrown while compiling a schema that must be left whole to valibot. */
class Uncompilable extends Error {}

/**
 * The compiled form of `schema`, built once per schema object and cached; `undefined` where
 * the runtime forbids code generation.
 *
 * @example
 * const check = compileSchema(AcquireCommandSchema);
 * const output = check === undefined ? REJECTED : check(value);
 * if (output === REJECTED) v.safeParse(AcquireCommandSchema, value); // valibot explains
 */
export function compileSchema(schema: v.GenericSchema): CompiledSchema | undefined {
  // An async schema's run is a promise; valibot's synchronous parse is not for it either. A
  // synchronous schema cannot hold an async one (valibot's types forbid it), so this is the only
  // place that asks.
  if (codeGeneration === false || schema.async) return undefined;
  let compiled = compiledSchemas.get(schema);
  if (compiled === undefined) {
    try {
      compiled = new Compiler().function(schema as unknown as Node);
      codeGeneration = true;
    } catch (error) {
      if (codeGeneration === undefined && error instanceof EvalError) {
        codeGeneration = false;
        return undefined;
      }
      if (!(error instanceof Uncompilable)) throw error;
      compiled = null;
    }
    compiledSchemas.set(schema, compiled);
  }
  return compiled ?? undefined;
}

const seenOnce = new WeakSet<object>();

/**
 * {@link compileSchema} from a schema's second use on: a schema object made for one parse (a
 * fresh `v.strictObject(…)` built per call) is never compiled, since generating its code costs
 * more than valibot's run of it. What `parseWith` calls.
 */
export function compiledOnReuse(schema: v.GenericSchema): CompiledSchema | undefined {
  if (!compiledSchemas.has(schema) && !seenOnce.has(schema)) {
    seenOnce.add(schema);
    return undefined;
  }
  return compileSchema(schema);
}

/**
 * valibot's `getDefault` and `getFallback`: a function is called with the arguments valibot
 * passes — the wrapper's dataset and configuration, or nothing for an object's missing key.
 */
function resolved(option: unknown, dataset?: Dataset): unknown {
  return typeof option === 'function'
    ? option(dataset, dataset === undefined ? undefined : CONFIG)
    : option;
}

/** Runs a schema or an action with valibot itself: exact, for what is not compiled here. */
function delegated(node: Node, typed: boolean): CompiledSchema {
  const runnable = node as unknown as Runnable;
  return (value) => {
    const dataset = runnable['~run'](typed ? { typed, value } : { value }, CONFIG);
    return dataset.issues ? REJECTED : dataset.value;
  };
}

/** Whether a missing key may stay missing (valibot's object and variant schemas ask exactly this). */
function mayBeMissing(node: Node): boolean {
  return node.type === 'exact_optional' || node.type === 'optional' || node.type === 'nullish';
}

/** A literal JSON can spell, so it can be written into the code (NaN and bigints cannot). */
function plainLiteral(value: unknown): value is string | boolean | number | null {
  return (
    typeof value === 'string' ||
    typeof value === 'boolean' ||
    value === null ||
    (typeof value === 'number' && !Number.isNaN(value))
  );
}

/** The code of a plain literal: JSON's spelling, or `Infinity` and `-Infinity`. */
function literalCode(value: string | boolean | number | null): string {
  if (typeof value === 'number' && !Number.isFinite(value)) {
    return value > 0 ? 'Infinity' : '-Infinity';
  }
  return JSON.stringify(value);
}

/**
 * Emits one function per object, array, union and variant schema (a function shared by many
 * schemas sees every shape at its property accesses, which the engine cannot specialise; one
 * per schema keeps each access to one shape), with primitives, pipes, checks and optional
 * wrappers written inline.
 */
class Compiler {
  private readonly functions = new Map<Node, CompiledSchema>();

  /** The compiled function of a node that gets one of its own. */
  function(node: Node): CompiledSchema {
    const known = this.functions.get(node);
    if (known !== undefined) return known;
    // A forward reference, so a cyclic schema does not recurse while compiling.
    let target: CompiledSchema = delegated(node, false);
    this.functions.set(node, (value) => target(value));
    target = this.build(node);
    this.functions.set(node, target);
    return target;
  }

  private build(node: Node): CompiledSchema {
    const body = new Body();
    const input = body.temp();
    let code: string;
    // A pipe node carries its first schema's properties (`reference` included): it is emitted
    // as a pipe whatever that schema is.
    switch (Array.isArray(node.pipe) ? undefined : node.reference) {
      case v.strictObject:
        code = this.strictObject(node, input, body);
        break;
      case v.array:
        code = this.array(node, input, body);
        break;
      case v.union:
        code = this.union(node, input, body);
        break;
      case v.variant: {
        const variant = this.variant(node, input, body);
        if (variant === undefined) return delegated(node, false);
        code = variant;
        break;
      }
      default:
        code = `${this.emit(node, input, input, body)}\nreturn ${input};`;
    }
    return body.compile(input, code);
  }

  /**
   * Statements that parse `source` with `node` into the variable `target`, returning
   * `R` from the enclosing function when valibot would report an issue.
   */
  private emit(node: Node, source: string, target: string, body: Body): string {
    const assign = source === target ? '' : `${target} = ${source};`;
    // `v.pipe` spreads its first schema's properties onto itself, so the pipe test comes first.
    if (Array.isArray(node.pipe)) return this.pipe(node.pipe as Node[], source, target, body);
    switch (node.reference) {
      case v.string:
        return `if (typeof ${source} !== 'string') return R; ${assign}`;
      case v.number:
        return `if (typeof ${source} !== 'number' || ${source} !== ${source}) return R; ${assign}`;
      case v.boolean:
        return `if (typeof ${source} !== 'boolean') return R; ${assign}`;
      case v.unknown:
        return assign;
      case v.literal:
      case v.picklist:
        return `if (!(${this.accepts(node, source, body)})) return R; ${assign}`;
      case v.custom:
        // Called on its schema, as valibot calls it.
        return `if (!${body.constant(node)}.check(${source})) return R; ${assign}`;
      case v.optional:
      case v.nullish:
      case v.nullable:
        return this.wrapper(node, source, target, body);
      case v.exactOptional:
        return this.emit(node.wrapped as Node, source, target, body);
      default:
        return this.call(node, source, target, body);
    }
  }

  /**
   * The test of a literal or a picklist as an expression, exactly valibot's (also a variant's
   * discriminator test); `undefined` for any other node.
   */
  private accepts(node: Node, value: string, body: Body): string | undefined {
    if (node.reference === v.picklist) return `${body.constant(node.options)}.includes(${value})`;
    if (node.reference !== v.literal) return undefined;
    const literal = node.literal;
    // valibot compares with SameValueZero; `===` differs from it only for NaN.
    if (Number.isNaN(literal)) return `${value} !== ${value}`;
    return `${value} === ${plainLiteral(literal) ? literalCode(literal) : body.constant(literal)}`;
  }

  /** A node compiled as a function of its own (or run by valibot), called from here. */
  private call(node: Node, source: string, target: string, body: Body): string {
    const compiled = [v.strictObject, v.array, v.union, v.variant].includes(node.reference as never)
      ? this.function(node)
      : delegated(node, false);
    return `${target} = ${body.constant(compiled)}(${source}); if (${target} === R) return R;`;
  }

  /** `optional`, `nullish`, `nullable`: the missing value (after its default) passes as is. */
  private wrapper(node: Node, source: string, target: string, body: Body): string {
    const missing =
      node.reference === v.optional
        ? `${target} === undefined`
        : node.reference === v.nullable
          ? `${target} === null`
          : `(${target} === null || ${target} === undefined)`;
    const assign = source === target ? '' : `${target} = ${source};`;
    const fallback =
      node.default === undefined
        ? ''
        : `if (${missing}) ${target} = D(${body.constant(node.default)}, { value: ${target} });`;
    return `${assign} ${fallback} if (!(${missing})) { ${this.emit(node.wrapped as Node, target, target, body)} }`;
  }

  /** `pipe`: the schema, then each action in order on its output; metadata is skipped. */
  private pipe(items: readonly Node[], source: string, target: string, body: Body): string {
    const [schema, ...actions] = items;
    const parts = [this.emit(schema as Node, source, target, body)];
    for (const action of actions) {
      if (action.kind === 'metadata') continue;
      parts.push(
        action.kind === 'schema'
          ? this.emit(action, target, target, body)
          : this.action(action, target, body),
      );
    }
    return parts.join('\n');
  }

  /** A pipe action on `value`; its dataset is typed, since every step before it passed. */
  private action(action: Node, value: string, body: Body): string {
    switch (action.reference) {
      case v.check:
        return `if (!${body.constant(action)}.requirement(${value})) return R;`;
      case v.minLength:
        return `if (${value}.length < ${Number(action.requirement)}) return R;`;
      case v.regex: {
        const pattern = action.requirement as RegExp;
        // A global or sticky pattern keeps state between tests, so the compiled run and
        // valibot's rerun of a rejected value could disagree: the whole schema stays valibot's.
        if (pattern.global || pattern.sticky) throw new Uncompilable();
        return `if (!${body.constant(pattern)}.test(${value})) return R;`;
      }
      case v.transform:
        return `${value} = ${body.constant(action)}.operation(${value});`;
    }
    // raw_check, and any kind added later.
    const run = body.constant(delegated(action, true));
    return `${value} = ${run}(${value}); if (${value} === R) return R;`;
  }

  /**
   * `strictObject`: the entries in their declared order (the output's key order), a default
   * for a missing optional entry that has one, a fallback stored unchecked, then no key
   * outside the entries — `for…in`, so inherited enumerable keys count, as in valibot.
   */
  private strictObject(node: Node, input: string, body: Body): string {
    const entries = node.entries as Record<string, Node>;
    const ownKeys = Object.getOwnPropertyNames(entries);
    // An entry named "__proto__" would set the output's prototype through `o["__proto__"] = p`.
    if (ownKeys.includes('__proto__')) {
      return `return ${body.constant(delegated(node, false))}(${input});`;
    }
    const output = body.temp();
    const parts = [`if (!${input} || typeof ${input} !== 'object') return R;`, `${output} = {};`];
    for (const key in entries) {
      const entry = entries[key] as Node;
      const name = JSON.stringify(key);
      const value = body.temp();
      let missing: string;
      if (mayBeMissing(entry) && entry.default !== undefined) {
        // valibot's getDefault without a dataset, then the entry's schema on it.
        const parse = body.constant(this.function(entry));
        missing = `${value} = ${parse}(D(${body.constant(entry.default)})); if (${value} === R) return R; ${output}[${name}] = ${value};`;
      } else if (entry.fallback !== undefined) {
        missing = `${output}[${name}] = D(${body.constant(entry.fallback)});`;
      } else missing = mayBeMissing(entry) ? '' : 'return R;';
      // Each field is read once, as valibot reads it.
      parts.push(
        `if (${name} in ${input}) { ${value} = ${input}[${name}]; ${this.emit(entry, value, value, body)} ${output}[${name}] = ${value}; } else { ${missing} }`,
      );
    }
    // `hasOwn(entries, key)` as a switch over the entries' own string keys.
    const cases = ownKeys.map((key) => `case ${JSON.stringify(key)}:`).join(' ');
    parts.push(
      ownKeys.length === 0
        ? `for (const k in ${input}) return R;`
        : `for (const k in ${input}) { switch (k) { ${cases} break; default: return R; } }`,
    );
    parts.push(`return ${output};`);
    return parts.join('\n');
  }

  private array(node: Node, input: string, body: Body): string {
    const output = body.temp();
    const index = body.temp();
    const item = body.temp();
    return [
      `if (!Array.isArray(${input})) return R;`,
      `${output} = [];`,
      `for (${index} = 0; ${index} < ${input}.length; ${index}++) {`,
      `${item} = ${input}[${index}];`,
      this.emit(node.item as Node, item, item, body),
      `${output}.push(${item}); }`,
      `return ${output};`,
    ].join('\n');
  }

  /** `union`: the first option that accepts the value gives the output. */
  private union(node: Node, input: string, body: Body): string {
    const parsed = body.temp();
    const options = (node.options as Node[]).map(
      (option) =>
        `${parsed} = ${body.constant(this.function(option))}(${input}); if (${parsed} !== R) return ${parsed};`,
    );
    return `${options.join('\n')}\nreturn R;`;
  }

  /**
   * `variant`: the object options (depth first through nested variants) whose discriminators
   * all accept the value are run in order, and valibot answers with the first typed result.
   * The first matching option that accepts the value therefore gives the output; when it
   * rejects and no other option matches, the variant rejects; when another option also
   * matches, valibot decides. Compiled only when every discriminator is a bare literal or
   * picklist (its check here is then exactly valibot's); otherwise `undefined`.
   */
  private variant(node: Node, input: string, body: Body): string | undefined {
    const matches: string[] = [];
    const parses: string[] = [];
    const collect = (variant: Node, keys: readonly string[]): boolean => {
      for (const option of variant.options as Node[]) {
        if (option.type === 'variant') {
          if (!collect(option, [...new Set([...keys, option.key as string])])) return false;
          continue;
        }
        const entries = option.entries as Record<string, Node> | undefined;
        if (entries === undefined) return false;
        const tests: string[] = [];
        for (const key of keys) {
          const entry = entries[key];
          if (entry === undefined || Array.isArray(entry.pipe)) return false;
          const name = JSON.stringify(key);
          const accepts = this.accepts(entry, `${input}[${name}]`, body);
          if (accepts === undefined) return false;
          tests.push(`(${name} in ${input} ? ${accepts} : ${mayBeMissing(entry)})`);
        }
        matches.push(tests.join(' && '));
        parses.push(body.constant(this.function(option)));
      }
      return true;
    };
    if (!collect(node, [node.key as string])) return undefined;
    const exact = body.constant(delegated(node, false));
    const parsed = body.temp();
    const parts = [`if (!${input} || typeof ${input} !== 'object') return R;`];
    matches.forEach((match, index) => {
      const later = matches.slice(index + 1).map((m) => `(${m})`);
      // valibot may still take a later matching option (after an untyped result): it decides.
      const rejected =
        later.length > 0 ? `return (${later.join(' || ')}) ? ${exact}(${input}) : R;` : 'return R;';
      parts.push(
        `if (${match}) { ${parsed} = ${parses[index]}(${input}); if (${parsed} !== R) return ${parsed}; ${rejected} }`,
      );
    });
    parts.push('return R;');
    return parts.join('\n');
  }
}

/** One generated function: its temporaries and the constants it closes over. */
class Body {
  private readonly constants: unknown[] = [];
  private temps = 0;

  temp(): string {
    return `t${this.temps++}`;
  }

  constant(value: unknown): string {
    let index = this.constants.indexOf(value);
    if (index < 0) index = this.constants.push(value) - 1;
    return `c[${index}]`;
  }

  compile(input: string, code: string): CompiledSchema {
    const temps = Array.from({ length: this.temps }, (_, index) => `t${index}`).filter(
      (name) => name !== input,
    );
    const declarations = temps.length > 0 ? `let ${temps.join(', ')};` : '';
    const source = `"use strict";\nreturn function compiled(${input}) {\n${declarations}\n${code}\n};`;
    const factory = new Function('R', 'D', 'c', source) as (
      rejected: symbol,
      resolve: typeof resolved,
      constants: unknown[],
    ) => CompiledSchema;
    return factory(REJECTED, resolved, this.constants);
  }
}
