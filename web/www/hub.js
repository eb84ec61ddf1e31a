// hub.js — models named hf:OWNER/REPO[:QUANT]: which GGUF file of a Hugging Face hub repository
// a name means, and the URLs and cache keys that go with it. Pure functions of the name and the
// hub's listing, so the worker (downloading) and the page (asking what is cached) agree.
//
// The listing is the hub's model API with blobs (`/api/models/OWNER/REPO/revision/main?blobs=true`):
// the commit (`sha`) and each file's name, size and, for LFS files, sha256.

/** Where hf: names resolve unless `hfEndpoint` says otherwise. */
export const HF_ENDPOINT = 'https://huggingface.co';
/** Taken when a name gives no quant, as llama.cpp's -hf does. */
export const DEFAULT_QUANT = 'Q4_K_M';

const HF_FORM = 'expected hf:OWNER/REPO or hf:OWNER/REPO:QUANT (e.g. hf:bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M)';

export function isHfName(model) {
  return typeof model === 'string' && model.startsWith('hf:');
}

export function parseHfName(name) {
  const rest = name.slice('hf:'.length);
  const colon = rest.indexOf(':');
  const repo = colon < 0 ? rest : rest.slice(0, colon);
  const quant = colon < 0 ? null : rest.slice(colon + 1);
  const part = /^[A-Za-z0-9._-]+$/;
  const [owner, model, extra] = repo.split('/');
  const ok = extra === undefined && [owner, model].every((p) => p && part.test(p) && p !== '.' && p !== '..');
  if (!ok || quant === '') throw new Error(`${name}: not a model name: ${HF_FORM}`);
  return { repo, quant };
}

/** The hub's base URL, without a trailing slash. */
export function hubBase(endpoint) {
  return (endpoint || HF_ENDPOINT).replace(/\/+$/, '');
}

export function listingUrl(base, repo) {
  return `${base}/api/models/${repo}/revision/main?blobs=true`;
}

/** `llama.cpp`'s split parts, `…-00001-of-00003.gguf`: [part, parts], or null. */
function splitPart(file) {
  const m = /-(\d{5})-of-(\d{5})\.gguf$/i.exec(file);
  return m ? [Number(m[1]), Number(m[2])] : null;
}

/**
 * The GGUF files whose names contain `quant` (ignoring case); of several, those where it is a
 * whole tag (Q4_0 matches x.Q4_0.gguf, not x.Q4_0_4_4.gguf) when there are any.
 */
function matching(ggufs, quant) {
  const q = quant.toLowerCase();
  const all = ggufs.filter((f) => f.toLowerCase().includes(q));
  const whole = (f) => {
    const lower = f.toLowerCase();
    for (let at = lower.indexOf(q); at >= 0; at = lower.indexOf(q, at + 1)) {
      const before = lower[at - 1] ?? '';
      const after = lower[at + q.length] ?? '';
      if (!/[a-z0-9]/.test(before) && !/[a-z0-9_]/.test(after)) return true;
    }
    return false;
  };
  const tags = all.filter(whole);
  return all.length > 1 && tags.length > 0 ? tags : all;
}

/** The GGUF file of `files` the name asks for and why that one; throws, listing the choices. */
function pickGguf(name, repo, quant, files) {
  const ggufs = files.filter((f) => /\.gguf$/i.test(f) && !/mmproj/i.test(f)).sort();
  if (ggufs.length === 0) {
    throw new Error(`${name}: ${repo} has no GGUF files (its files: ${files.join(', ')}); weft loads GGUF models by name`);
  }
  let file;
  let why;
  if (quant) {
    const found = matching(ggufs, quant);
    const oneSplit = found.length > 1 && found.every((f) => splitPart(f)) &&
      new Set(found.map((f) => f.replace(/-\d{5}-of-\d{5}\.gguf$/i, ''))).size === 1;
    if (found.length === 0) throw new Error(`${name}: no GGUF files match "${quant}"; the repository's GGUF files: ${ggufs.join(', ')}`);
    if (found.length > 1 && !oneSplit) {
      throw new Error(`${name}: "${quant}" matches several GGUF files: ${found.join(', ')}; name one more exactly (hf:${repo}:NAME, any part of the file name)`);
    }
    [file, why] = [found[0], `the GGUF file matching ${quant}`];
  } else {
    const defaults = matching(ggufs, DEFAULT_QUANT);
    if (defaults.length >= 1) [file, why] = [defaults[0], `${DEFAULT_QUANT}, the default; another with hf:${repo}:QUANT`];
    else if (ggufs.length === 1) [file, why] = [ggufs[0], 'the only GGUF file'];
    else [file, why] = [ggufs[0], `no ${DEFAULT_QUANT} among the GGUF files, so the first; another with hf:${repo}:QUANT, from: ${ggufs.join(', ')}`];
  }
  const split = splitPart(file);
  if (split) {
    throw new Error(`${name}: ${file} is one of ${split[1]} parts of a split GGUF, which weft does not read; join them with llama.cpp's llama-gguf-split --merge and load the joined file`);
  }
  return { file, why };
}

/**
 * What `name` means in `listing` (parsed JSON): {repo, file, why, commit, size, sha256, url, key}.
 * `url` is the file's resolve URL at the listed commit; `key` is where a store keeps it: by its
 * sha256 where the hub lists one, so a new commit that leaves the file alone needs no download.
 */
export function resolveHubFile(name, base, listing) {
  const { repo, quant } = parseHfName(name);
  const siblings = Array.isArray(listing?.siblings) ? listing.siblings : null;
  if (!siblings || typeof listing.sha !== 'string') {
    throw new Error(`${name}: the hub's listing has no commit or file list: is ${base} a Hugging Face hub?`);
  }
  const { file, why } = pickGguf(name, repo, quant, siblings.map((s) => String(s.rfilename)));
  const entry = siblings.find((s) => s.rfilename === file);
  const sha256 = entry.lfs?.sha256 ?? null;
  const size = Number(entry.lfs?.size ?? entry.size);
  if (!(size > 0)) throw new Error(`${name}: the hub's listing gives no size for ${file}: is ${base} a Hugging Face hub?`);
  const url = `${base}/${repo}/resolve/${listing.sha}/${file.split('/').map(encodeURIComponent).join('/')}`;
  const key = `${base}/${repo}/blobs/${sha256 ?? `${listing.sha}/${file}`}`;
  return { repo, file, why, commit: listing.sha, size, sha256, url, key };
}
