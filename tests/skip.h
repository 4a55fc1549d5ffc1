/* SKIP("why", ...): skip the running cmocka test and say why. cmocka's
 * skip() takes no reason; this prints "SKIP: why" first, on the stream
 * cmocka writes its own lines to, and tests/run.sh puts the reason beside
 * the test's name in the binary's summary line. Include after cmocka.h. */
#ifndef TALLY_TEST_SKIP_H
#define TALLY_TEST_SKIP_H

#define SKIP(...)                                                                                                  \
    do {                                                                                                           \
        print_message("SKIP: " __VA_ARGS__);                                                                       \
        print_message("\n");                                                                                       \
        skip();                                                                                                    \
    } while (0)

#endif
