package kfpipe.bench;

import static io.confluent.parallelconsumer.ParallelConsumerOptions.CommitMode.PERIODIC_CONSUMER_ASYNCHRONOUS;
import static io.confluent.parallelconsumer.ParallelConsumerOptions.ProcessingOrder.KEY;

import io.confluent.parallelconsumer.ParallelConsumerOptions;
import io.confluent.parallelconsumer.ParallelStreamProcessor;
import java.lang.management.ManagementFactory;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The Parallel Consumer peer of kfpipe's consumer benchmark: reads COUNT records of TOPIC
 * from the start with KEY ordering and a no-op function, and prints one JSON line — the
 * rate from the first record to the last, from the start, and the process's CPU time.
 *
 * <p>Usage: java -jar pc-peer.jar BROKERS TOPIC GROUP COUNT MAX_CONCURRENCY
 */
public final class Main {
  public static void main(String[] args) throws Exception {
    if (args.length != 5) {
      System.err.println("usage: pc-peer BROKERS TOPIC GROUP COUNT MAX_CONCURRENCY");
      System.exit(2);
    }
    String brokers = args[0], topic = args[1], group = args[2];
    long count = Long.parseLong(args[3]);
    int concurrency = Integer.parseInt(args[4]);
    long started = System.nanoTime();
    com.sun.management.OperatingSystemMXBean os =
        (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
    long cpu0 = os.getProcessCpuTime();

    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p);
    ParallelConsumerOptions<byte[], byte[]> options =
        ParallelConsumerOptions.<byte[], byte[]>builder()
            .ordering(KEY)
            .maxConcurrency(concurrency)
            .consumer(consumer)
            .commitMode(PERIODIC_CONSUMER_ASYNCHRONOUS)
            .build();
    ParallelStreamProcessor<byte[], byte[]> pc =
        ParallelStreamProcessor.createEosStreamProcessor(options);

    AtomicLong seen = new AtomicLong();
    AtomicLong first = new AtomicLong(), last = new AtomicLong();
    CountDownLatch done = new CountDownLatch(1);
    pc.subscribe(List.of(topic));
    pc.poll(
        ctx -> {
          long n = seen.addAndGet(ctx.size());
          long now = System.nanoTime();
          first.compareAndSet(0, now);
          if (n >= count && last.compareAndSet(0, now)) {
            done.countDown();
          }
        });
    boolean ok = done.await(5, TimeUnit.MINUTES);
    long cpu = os.getProcessCpuTime() - cpu0;
    pc.closeDontDrainFirst();
    if (!ok) {
      System.err.printf("pc-peer: %d of %d records within 5 minutes%n", seen.get(), count);
      System.exit(1);
    }
    double firstToLast = (last.get() - first.get()) / 1e9, fromStart = (last.get() - started) / 1e9;
    System.out.printf(
        "{\"count\":%d,\"msgs_per_sec\":%.0f,\"from_start_msgs_per_sec\":%.0f,\"cpu_s\":%.3f,\"max_concurrency\":%d}%n",
        seen.get(), count / firstToLast, count / fromStart, cpu / 1e9, concurrency);
    System.exit(0);
  }
}
