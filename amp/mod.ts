/**
 * Automatic mixed precision. Today: the autocast policy as data (the f16,
 * f32 and promote op lists, and custom allow/deny lists). Master weights,
 * loss scaling, accumulation and clipping build on it.
 *
 * @module
 */
export {
  type AutocastLists,
  type CastPolicy,
  castPolicyOf,
  customAutocastLists,
  type CustomListsOptions,
  DEFAULT_AUTOCAST_LISTS,
} from "./policy.ts";
