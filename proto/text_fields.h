/* The text fields a SubmitRequest and a TokenizeRequest share (pagoda.proto): a prompt's text, or
 * a chat with its template's inputs, and add_special_tokens. A Tokenize call gives the ids a
 * Submit of the same fields would have as its prompt, so the client builds a Tokenize from a
 * Submit's fields and the router checks and tokenizes it as a Submit: both copies are here, one
 * beside the other from one list of the fields: a text field added to both messages is added there.
 *
 * The copies are shallow: the destination points into the source's strings and messages. */
#ifndef PAGODA_PROTO_TEXT_FIELDS_H
#define PAGODA_PROTO_TEXT_FIELDS_H

#include "proto/pagoda.pb-c.h"

/* Sets t's text fields to s's (t's other fields are left as they are). */
void text_fields_to_tokenize(Pagoda__TokenizeRequest *t, const Pagoda__SubmitRequest *s);

/* Sets s's text fields to t's (s's other fields are left as they are). */
void text_fields_to_submit(Pagoda__SubmitRequest *s, const Pagoda__TokenizeRequest *t);

#endif
