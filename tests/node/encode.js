// Usage: node encode.js <host:port> <model> <include dir>... < texts.json
// Loads sie.v1 from proto/ at run time, calls Inference/Encode, prints {id: [floats]} as JSON.
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");
const path = require("path");

const [address, model, ...includeDirs] = process.argv.slice(2);
const root = path.resolve(__dirname, "..", "..", "proto");
const definition = protoLoader.loadSync("sie/v1/inference.proto", {
  includeDirs: [root, ...includeDirs],
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});
const sie = grpc.loadPackageDefinition(definition).sie.v1;
const client = new sie.Inference(address, grpc.credentials.createInsecure());

let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  const texts = JSON.parse(input);
  const items = texts.map((text, index) => ({ id: String(index), text }));
  client.Encode({ model, items }, (error, response) => {
    if (error) {
      console.error(`${error.code} ${error.details}`);
      process.exit(1);
    }
    const out = {};
    for (const result of response.results) {
      const bytes = result.dense.data; // packed little-endian float32
      const floats = [];
      for (let offset = 0; offset < bytes.length; offset += 4) floats.push(bytes.readFloatLE(offset));
      out[result.id] = floats;
    }
    console.log(JSON.stringify(out));
    client.close();
  });
});
