// Runs an exported ONNX model with onnxruntime-node on .npy cubes and prints JSON
// [{"cube": path, "parameters": [..]}] (and "covariance": [[..], ..] when the model has that
// output): the ONNX side of tests/export/export_test.cc.
//   node run_onnx.js ONNXRUNTIME_NODE_DIR MODEL.onnx CUBE.npy...
// Cubes: .npy format 1.0, little-endian int16 or float32, C order, (D,H,W) or (C,D,H,W); int16
// counts are converted to float32 (exact), the model's input type. All cubes run as one batch.
'use strict';
const fs = require('fs');

function readNpy(path) {
  const buf = fs.readFileSync(path);
  if (buf.toString('latin1', 1, 6) !== 'NUMPY') throw new Error(`${path}: not a .npy file`);
  const major = buf[6];
  const headerLen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = (major === 1 ? 10 : 12) + headerLen;
  const header = buf.toString('latin1', major === 1 ? 10 : 12, start);
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  if (/'fortran_order':\s*True/.test(header)) throw new Error(`${path}: Fortran order`);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').filter((s) => s.trim()).map(Number);
  const n = shape.reduce((a, b) => a * b, 1);
  const body = buf.subarray(start);
  const values = new Float32Array(n);
  if (descr === '<i2') for (let i = 0; i < n; ++i) values[i] = body.readInt16LE(2 * i);
  else if (descr === '<f4') for (let i = 0; i < n; ++i) values[i] = body.readFloatLE(4 * i);
  else throw new Error(`${path}: dtype ${descr}, expected <i2 or <f4`);
  return {shape: shape.length === 3 ? [1, ...shape] : shape, values};
}

async function main() {
  const [ortDir, modelPath, ...cubePaths] = process.argv.slice(2);
  const ort = require(require.resolve('onnxruntime-node', {paths: [ortDir]}));
  const session = await ort.InferenceSession.create(modelPath, {executionProviders: ['cpu']});
  const cubes = cubePaths.map(readNpy);
  const per = cubes[0].values.length;
  const batch = new Float32Array(per * cubes.length);
  cubes.forEach((c, i) => batch.set(c.values, i * per));
  const feeds = {counts: new ort.Tensor('float32', batch, [cubes.length, ...cubes[0].shape])};
  const result = await session.run(feeds);
  const out = result.parameters;
  const p = out.dims[1];
  const rows = cubePaths.map((path, i) => ({cube: path, parameters: Array.from(out.data.slice(i * p, (i + 1) * p))}));
  if (result.covariance) {
    const cov = result.covariance.data;
    rows.forEach((row, i) => {
      row.covariance = [];
      for (let r = 0; r < p; ++r) row.covariance.push(Array.from(cov.slice((i * p + r) * p, (i * p + r + 1) * p)));
    });
  }
  process.stdout.write(JSON.stringify(rows) + '\n');
}

main().catch((e) => {
  process.stderr.write(`run_onnx.js: error: ${e.message}\n`);
  process.exit(1);
});
