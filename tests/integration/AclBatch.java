import java.nio.file.Files;
import java.nio.file.Path;
import org.apache.kafka.common.utils.Exit;
import org.apache.kafka.tools.AclCommand;

/**
 * Runs kafka-acls.sh commands, one per line with tab-separated arguments, in one JVM (test_kafka_sasl.py:
 * a JVM per command costs seconds). A command that would exit non-zero fails the batch.
 */
public class AclBatch {
    public static void main(String[] argv) throws Exception {
        Exit.setExitProcedure((code, message) -> {
            if (code != 0) {
                throw new IllegalStateException("kafka-acls.sh exited " + code + ": " + message);
            }
        });
        for (String line : Files.readAllLines(Path.of(argv[0]))) {
            if (!line.isEmpty()) {
                AclCommand.main(line.split("\t"));
            }
        }
    }
}
