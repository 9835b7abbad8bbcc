// Reads Avro records in the Schema Registry wire format (magic byte 0, 4-byte schema id) from a topic with
// the Apache Avro Java library, each value's writer schema fetched from the registry's Confluent REST API
// (GET /schemas/ids/{id}), and prints each record as one JSON line: a third-party client, sharing no code
// with the worker, reading its results. Usage:
//   java -cp 'libs/*' AvroResultsReader.java BOOTSTRAP TOPIC REGISTRY_URL COUNT
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.DecoderFactory;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class AvroResultsReader {
    private static final HttpClient HTTP = HttpClient.newHttpClient();
    private static final Map<Integer, Schema> SCHEMAS = new HashMap<>();

    static Schema schema(String registry, int id) throws IOException, InterruptedException {
        Schema known = SCHEMAS.get(id);
        if (known != null) {
            return known;
        }
        HttpRequest request = HttpRequest.newBuilder(URI.create(registry + "/schemas/ids/" + id)).build();
        HttpResponse<String> response = HTTP.send(request, HttpResponse.BodyHandlers.ofString());
        if (response.statusCode() != 200) {
            throw new IOException("schema id " + id + ": HTTP " + response.statusCode() + " " + response.body());
        }
        String text = new ObjectMapper().readTree(response.body()).get("schema").asText();
        Schema parsed = new Schema.Parser().parse(text);
        SCHEMAS.put(id, parsed);
        return parsed;
    }

    static GenericRecord decode(String registry, byte[] value) throws IOException, InterruptedException {
        ByteBuffer buffer = ByteBuffer.wrap(value);
        if (value.length < 6 || buffer.get() != 0) {
            throw new IOException("not in the wire format (magic byte 0, 4-byte schema id)");
        }
        Schema writer = schema(registry, buffer.getInt());
        GenericDatumReader<GenericRecord> reader = new GenericDatumReader<>(writer);
        return reader.read(null, DecoderFactory.get().binaryDecoder(value, 5, value.length - 5, null));
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], registry = args[2];
        int wanted = Integer.parseInt(args[3]);
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, "interop-" + UUID.randomUUID());
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        int read = 0;
        long deadline = System.currentTimeMillis() + 120_000;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(topic));
            while (read < wanted && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(500))) {
                    // GenericData.Record's toString is its JSON form.
                    System.out.println(decode(registry, record.value()));
                    read++;
                }
            }
        }
        System.out.flush();
        if (read < wanted) {
            System.err.println("read " + read + " of " + wanted + " records before the deadline");
            System.exit(1);
        }
    }
}
