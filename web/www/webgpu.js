// webgpu.js — whether this browser can run weft. Apart from weft.js because the worker needs it
// too: importing weft.js there would make the worker script import the module that starts it, a
// cycle that bundlers following `new Worker(new URL(…, import.meta.url))` handle badly.

const BROWSERS = 'Chrome or Edge 113+ on desktop (Windows, macOS, ChromeOS; Android 121+), ' +
  'Chromium on Linux started with --enable-unsafe-webgpu (or chrome://flags/#enable-unsafe-webgpu), ' +
  'Safari 26 (macOS/iOS), or Firefox 141+ on Windows';

/**
 * Can this browser run weft? Resolves to {available, reason, adapter}; reason is '' when available,
 * otherwise a sentence for a person saying why not and what to do. Never rejects.
 */
export async function webgpuStatus() {
  const g = globalThis;
  if (!g.navigator || !g.navigator.gpu) {
    if (g.isSecureContext === false) {
      return {
        available: false, adapter: null,
        reason: 'WebGPU needs a secure context: open this page over https:// or from http://localhost ' +
          `(not a plain http:// address), in a browser with WebGPU: ${BROWSERS}.`,
      };
    }
    return {
      available: false, adapter: null,
      reason: `This browser does not offer WebGPU (navigator.gpu is missing). Use a browser with WebGPU: ${BROWSERS}. ` +
        'The page must be served over https:// or from localhost.',
    };
  }
  let adapter = null;
  try {
    adapter = await Promise.race([
      g.navigator.gpu.requestAdapter(),
      new Promise((resolve) => setTimeout(() => resolve('timeout'), 15000)),
    ]);
  } catch (e) {
    return {
      available: false, adapter: null,
      reason: `WebGPU is present but requesting a GPU adapter failed (${e?.message || e}). ` +
        'Update the graphics driver or the browser, or enable hardware acceleration in the browser settings.',
    };
  }
  if (adapter === 'timeout') {
    return {
      available: false, adapter: null,
      reason: 'WebGPU is present but the browser did not answer the request for a GPU adapter within 15 s.',
    };
  }
  if (!adapter) {
    return {
      available: false, adapter: null,
      reason: 'WebGPU is present but no suitable GPU adapter was found: the GPU or its driver may be ' +
        'blocklisted, hardware acceleration may be off, or (on Linux) WebGPU must be enabled with ' +
        '--enable-unsafe-webgpu / chrome://flags/#enable-unsafe-webgpu. Check chrome://gpu (or about:support) ' +
        'for the WebGPU status, update the driver, or try another browser.',
    };
  }
  const info = adapter.info || {};
  const limits = adapter.limits || {};
  return {
    available: true,
    reason: '',
    adapter: {
      name: info.description || [info.vendor, info.architecture, info.device].filter(Boolean).join(' ') || 'WebGPU adapter',
      vendor: info.vendor || '',
      architecture: info.architecture || '',
      device: info.device || '',
      description: info.description || '',
      isFallbackAdapter: Boolean(info.isFallbackAdapter ?? adapter.isFallbackAdapter),
      shaderF16: adapter.features?.has?.('shader-f16') ?? false,
      subgroups: adapter.features?.has?.('subgroups') ?? false,
      subgroupMinSize: info.subgroupMinSize ?? null,
      subgroupMaxSize: info.subgroupMaxSize ?? null,
      timestampQuery: adapter.features?.has?.('timestamp-query') ?? false,
      limits: {
        maxStorageBufferBindingSize: limits.maxStorageBufferBindingSize,
        maxBufferSize: limits.maxBufferSize,
        maxComputeInvocationsPerWorkgroup: limits.maxComputeInvocationsPerWorkgroup,
        maxComputeWorkgroupStorageSize: limits.maxComputeWorkgroupStorageSize,
        maxStorageBuffersPerShaderStage: limits.maxStorageBuffersPerShaderStage,
      },
    },
  };
}
